"""How a script ends on an exception: a mistake a user can fix is raised as UserError and printed as one line,
`error: ...`, status 2, no traceback; Ctrl-C is `interrupted (Ctrl-C)` (130); a closed stdout pipe ends quietly with
141, as SIGPIPE would (`set -o pipefail` still sees the output was cut); anything else is a bug with its traceback."""
import json
import os
import select
import signal
import sys
import time
from contextlib import suppress

from gpt.runtime.files import atomic_write

# only the standard library's small modules here: the scripts import this module first, before torch, so
# that Ctrl-C while torch loads is already the short line
_failure_callbacks = []  # the process's, as atexit's are: added by on_failure, called once by the hook
# what torchrun sets in each process it starts (gpt/runtime/distributed.py's launch checks them)
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# long enough for torchrun to notice local rank 0's exit (it looks every 0.1 s by default)
OTHER_RANKS_WAIT_S = 5


class UserError(Exception):
    pass


def on_failure(callback):
    """Call `callback()` (rundir.py's Claim.undo) if the script ends on an uncaught exception, before its message is
    printed, so that stays the last line. Not atexit, which runs at every exit; a kill runs neither."""
    _failure_callbacks.append(callback)


def _stderr():
    # the real stderr: torch.distributed wraps the hook and buffers sys.stderr while it runs, and the exit
    # below would skip printing that buffer
    return sys.__stderr__ or sys.stderr


def _stdout_closed():
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poll = select.poll()
        poll.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no stdout, or no poll (Windows)
        return False


def _torchrun_report(line):
    """The line into this worker's torchrun error file (its failure summary shows it); True on rank 0 or alone."""
    if error_file := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        with suppress(OSError), atomic_write(error_file, "w") as f:  # else the summary says less
            # the layout torchrun's own @record writes, which its summary shows as the "traceback"
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    return not _other_rank()


def _other_rank():
    """Whether this is a real torchrun rank but 0 (not a half-set launch, RANK alone: it may lack a rank 0 to speak)."""
    rank = os.environ.get("RANK", "")
    return all(os.environ.get(k) for k in TORCHRUN_VARIABLES) and rank.isdigit() and int(rank) != 0


def _excepthook(kind, value, tb):
    _handle(kind, value)
    sys.__excepthook__(kind, value, tb)


def _handle(kind, value):
    """What the hook does before a traceback: puts back what the run changed, then ends the process itself (a
    line and a status) for Ctrl-C, a user's mistake and a closed stdout; returns for anything else (a bug)."""
    while _failure_callbacks:  # on_failure's
        callback = _failure_callbacks.pop()  # last registered first, as atexit
        try:
            callback()
        except Exception as e:  # putting back what it can must not hide the error that ended the run
            print(f"note: could not undo what the run changed ({type(e).__name__}: {e})", file=_stderr(), flush=True)
    if issubclass(kind, KeyboardInterrupt):  # Ctrl-C outside the training loop (which stops cleanly itself)
        print("interrupted (Ctrl-C)", file=_stderr(), flush=True)
        sys.exit(130)  # 128 + SIGINT, as a shell reports it
    if issubclass(kind, UserError):
        line = f"error: {value}"
        if os.environ.get("LOCAL_RANK", "").isdigit() and int(os.environ["LOCAL_RANK"]) > 0:
            # a bad setting fails every worker alike: local rank 0 exits at once, the others wait for torchrun's
            # stop (SIGTERM) and exit 0, so its summary names one worker per node (docs/scaling.md)
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            time.sleep(OTHER_RANKS_WAIT_S)
        if _torchrun_report(line):
            print(line, file=_stderr(), flush=True)
        sys.exit(2)  # sys.exit inside the hook sets the interpreter's exit status
    if issubclass(kind, BrokenPipeError) and _stdout_closed():
        # nothing more can be written there, and Python's flush at exit would complain about it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
        sys.exit(141)  # 128 + SIGPIPE


def _like_a_new_worker():
    """A worker that torchrun forks (`--run-path --start-method=fork`) is a copy of torchrun's process, run in
    torch's wrappers, that ends without Python's exit; made one of its own (docs/scaling.md): the hook sees its
    exceptions (from torchrun's error handler: the wrapper catches them first), Python's signal handlers replace
    torchrun's, its atexit functions run at its end. Only in a child process that has torchrun loaded."""
    handlers = sys.modules.get("torch.distributed.elastic.multiprocessing.errors.error_handler")
    handler = getattr(handlers, "ErrorHandler", None)
    process = sys.modules.get("multiprocessing.process")
    if handler is None or process is None or process.parent_process() is None or hasattr(handler, "_hook"):
        return
    import atexit
    import multiprocessing.util

    def record_exception(self, e):
        _handle(type(e), e)  # exits for a user's mistake; a bug goes on to torchrun's report of its traceback
        handler._hook(self, e)

    handler._hook, handler.record_exception = handler.record_exception, record_exception
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, lambda *_: _handle(KeyboardInterrupt, None))
    multiprocessing.util.Finalize(None, atexit._run_exitfuncs, exitpriority=0)  # none left for a spawned one's exit


class ExitOnCtrlC:
    """Ctrl-C exits at once, with the hook's line and status, while the block runs: `import torch`, where a
    KeyboardInterrupt raised inside torch's C++ callbacks cannot unwind and aborts the process ("terminate called")."""

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._exit)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)

    @staticmethod
    def _exit(signum, frame):
        print("interrupted (Ctrl-C)", file=_stderr(), flush=True)
        os._exit(130)


def install():
    """Entry scripts call this once, first: the hook, and no stdout on a torchrun rank other than 0."""
    sys.excepthook = _excepthook
    _like_a_new_worker()
    if _other_rank():
        sys.stdout = open(os.devnull, "w")
