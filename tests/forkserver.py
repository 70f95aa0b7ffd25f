"""
The tests' script launches (conftest.run), forked from a process that has already imported numpy and torch.

Why: most tests run a script as a user would, `python train.py ...`, and on CI's 2 cores every such process
spends ~1.5 s of CPU importing torch before it does anything: most of the suite's time. Here one server
process per test worker imports them once; each launch is a fork of it that runs the script as the
interpreter would: its argv, working folder, environment and sys.path[0], the script as __main__, stdout and
stderr in files, stdin empty, an uncaught exception through sys.excepthook (whose SystemExit sets the status,
as gpt/runtime/errors.py's does) and the interpreter's own exit (atexit, finalization). The caller gets a
subprocess.CompletedProcess, as from subprocess.run. (A second server, for launches that read or write a
transformers folder, has imported transformers' model classes too: TRANSFORMERS below.)

A torchrun run expected to succeed is forked too: torchrun itself runs in the fork, and its workers are forks
of it (run_torchrun), so neither the launcher nor a worker imports torch again.

What a fork cannot give is a fresh interpreter: torch's import has happened before the script starts (so its
start-up line's "import torch" is ~0 s), and the signals a test sends need a process of its own. Launches that
need one go through subprocess as before: torchrun runs meant to fail, `-c` code, other scripts than the
repository's .py files, a call with environment variables of its own (but those FORKABLE_VARIABLES), everything
off Linux (a fork of a process that has loaded macOS's frameworks is unsafe), and everything when
NANOGPT_TESTS_FRESH=1 (CI runs its torch 2.11 leg that way).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

# the server: reads one JSON request a line on stdin, forks a child for it, and writes {"id", "pid"} at once
# and {"id", "status"} when the child ends. Single-threaded (a fork copies only the forking thread, so no
# other thread may hold a lock then): it waits for requests and children in one loop.
SERVER = r"""
import json, os, select, sys
import numpy, torch  # what every launch would import first
import contextlib, io
preloaded = io.StringIO()  # what the preload (argv[1]) printed as it imported, which each child prints on stderr
with contextlib.redirect_stdout(preloaded), contextlib.redirect_stderr(preloaded):
    exec(sys.argv[1])

def child(request):
    os.setpgid(0, 0)  # its own process group: a timeout kills it and whatever it started
    for fd, (path, flags) in enumerate([(os.devnull, os.O_RDONLY),
                                        (request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                        (request["stderr"], os.O_WRONLY | os.O_TRUNC)]):
        os.dup2(os.open(path, flags), fd)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.stderr.write(preloaded.getvalue())
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = request["path0"]  # the script's folder, as the interpreter puts it first
    import runpy
    try:
        if request["module"]:  # python -m module (torchrun, whose workers run the script with sys.path as it is)
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException:
        kind, value, tb = sys.exc_info()
        while tb is not None and tb.tb_frame.f_code.co_filename != script:  # from the script's frames on
            tb = tb.tb_next
        if tb is not None:
            value.__traceback__ = tb  # what the default hook prints (it reads the exception's own)
        try:
            sys.excepthook(kind, value, value.__traceback__)
            code = 1
        except SystemExit as e:
            code = e.code
    sys.exit(code)

# what is imported now, out of the collector's sight: a child's exit, its interpreter's finalization, then does not
# walk all of torch's objects in its last collection and copy every page they sit on (most of a small launch's time)
import gc
gc.freeze()
requests = os.fdopen(0, "rb", buffering=0)
replies = os.fdopen(1, "w", buffering=1)
buffer, children = b"", {}
while True:
    ready, _, _ = select.select([requests], [], [], 0.02 if children else None)
    if ready:
        data = os.read(requests.fileno(), 65536)
        if not data:
            break
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request)
            children[pid] = request["id"]
            replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        replies.write(json.dumps({"id": children.pop(pid), "status": os.waitstatus_to_exitcode(status)}) + "\n")
"""


class Launch:
    """One request's progress, as the server's replies tell it: forked (with its pid), then ended (with its
    exit status, negative for a signal, as subprocess gives it)."""

    def __init__(self):
        self.forked, self.ended = threading.Event(), threading.Event()
        self.pid = self.status = None


class ForkServer:
    """One server process (started at the first launch), shared by the calling process's threads."""

    def __init__(self, env, preload=""):
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=self.env, text=True, bufsize=1)
        self.lock = threading.Lock()
        self.waiting = {}  # id -> Launch
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            reply = json.loads(line)
            launch = self.waiting[reply["id"]]
            if "pid" in reply:
                launch.pid = reply["pid"]
                launch.forked.set()
            else:
                launch.status = reply["status"]
                launch.ended.set()
        for launch in list(self.waiting.values()):  # the server died: nobody waits forever
            launch.forked.set()
            launch.ended.set()

    def run(self, argv, cwd, env, timeout, module, path0):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            for path in (out, err):
                open(path, "w").close()
            with self.lock:
                self.next_id += 1
                key = self.next_id
                launch = self.waiting[key] = Launch()
                self.proc.stdin.write(json.dumps({"id": key, "argv": argv, "cwd": str(cwd), "env": env,
                                                  "stdout": out, "stderr": err, "module": module,
                                                  "path0": path0}) + "\n")
                self.proc.stdin.flush()
            launch.forked.wait()
            if not launch.ended.wait(timeout):
                os.killpg(launch.pid, 9)
                launch.ended.wait()
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
            del self.waiting[key]
            if launch.status is None:
                raise RuntimeError("the tests' fork server ended")
            with open(out) as f_out, open(err) as f_err:
                return subprocess.CompletedProcess([sys.executable, *argv], launch.status, f_out.read(), f_err.read())


_servers = {}  # preload -> ForkServer
_server_lock = threading.Lock()

# a launch that reads or writes a transformers folder imports transformers' model classes, ~4 s of CPU each time on
# CI's cores: those launches fork from a second server that has imported them. Hugging Face's libraries read their
# variables as they are imported, so only a launch with no variables of its own goes there (the server's are the
# tests' own); and only a script that would import them anyway, since a fork cannot unimport them.
TRANSFORMERS = ("from transformers import AutoConfig, GPT2LMHeadModel, LlamaForCausalLM, PreTrainedTokenizerFast\n"
                "from transformers.utils import cached_file")


def reads_transformers(script, args, cwd):
    """export.py (it writes a transformers folder), or a script given a folder as --init_from."""
    folder = next((str(a).split("=", 1)[1] for a in args if str(a).startswith("--init_from=")), "")
    return os.path.basename(str(script)) == "export.py" or bool(folder) and os.path.isdir(os.path.join(cwd, folder))


# variables that neither numpy nor torch reads as it is imported (the libraries that do, Hugging Face's, are
# imported by the script, after the fork): a launch that sets only these can still be a fork
FORKABLE_VARIABLES = re.compile(r"HF_\w+|HELLASWAG_DIR|WANDB_\w+")


def usable(script, nproc, extra_env, cwd, root, check=True):
    """Whether a launch can be a fork: a .py file of the repository, no variables of its own but those above;
    several processes only for a run expected to succeed (run_torchrun says how)."""
    path = os.path.abspath(os.path.join(str(cwd), str(script)))
    return (os.environ.get("NANOGPT_TESTS_FRESH") != "1" and sys.platform.startswith("linux")  # macOS: no fork
            and (nproc == 1 or check) and all(FORKABLE_VARIABLES.fullmatch(k) for k in extra_env or {})
            and str(script).endswith(".py") and path.startswith(os.path.abspath(root) + os.sep))


def run(argv, cwd, env, timeout, module=None, script=None, preload=""):
    """The script (argv[0]) with its arguments, or `python -m module` with argv as its sys.argv and `script` the
    one it runs, forked from the server that has run `preload` (made at its first call with `env`)."""
    with _server_lock:
        server = _servers.get(preload)
        if server is None or server.proc.poll() is not None:
            server = _servers[preload] = ForkServer(env, preload)
    path0 = os.path.dirname(os.path.abspath(os.path.join(str(cwd), str(script or argv[0]))))
    return server.run([str(a) for a in argv], cwd, env, timeout, module, path0)


def run_torchrun(script, args, nproc, cwd, env, timeout):
    """`torchrun --standalone --nproc_per_node=nproc script args` as a fork: the launcher runs in the forked process,
    and its workers are forks of it that run the script with runpy (torchrun's --run-path, --start-method=fork)
    instead of new interpreters. The agent, its rendezvous, the workers' variables and its ending are torchrun's
    own; a run that is meant to fail (check=False: how torchrun reports it) or that has to start fresh uses the
    plain command instead."""
    path = os.path.abspath(os.path.join(str(cwd), str(script)))
    argv = ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "--run-path", "--start-method=fork", path, *args]
    return run(argv, cwd, env, timeout, module="torch.distributed.run", script=path)
