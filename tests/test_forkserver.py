"""tests/forkserver.py, which most tests' script launches go through: a forked launch ends as a fresh
interpreter's would, the same status, stdout and stderr, for each way a script can end, and sees its own
argv, working folder, environment, sys.path[0] and an empty stdin."""
import os
import subprocess
import sys

import forkserver
import pytest
from conftest import ROOT, TORCHRUN, counting_ids, flags, log_rows, tiny, write_ids_dataset

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server runs on Linux only")

SCRIPT = r"""
import atexit, os, sys
sys.path.insert(0, os.environ["ROOT"])
from gpt.runtime import errors
errors.install()
atexit.register(lambda: print("atexit ran"))
print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[1] == os.path.dirname(os.path.abspath(__file__)))
print("env", os.environ.get("CASE"), "stdin", repr(sys.stdin.read()), "main", __name__)
print("to stderr", file=sys.stderr)
case = sys.argv[1]
if case == "user_error":
    raise errors.UserError("a bad setting")
if case == "bug":
    raise ValueError("a bug")
if case == "exit_message":
    sys.exit("stopped here")
if case == "exit_3":
    sys.exit(3)
"""


@pytest.mark.parametrize("case", ["fine", "user_error", "bug", "exit_message", "exit_3"])
def test_a_forked_launch_ends_as_a_fresh_interpreter(tmp_path, case):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "ROOT": ROOT, "CASE": case}
    fresh = subprocess.run([sys.executable, str(script), case], cwd=tmp_path, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60)
    forked = forkserver.run([str(script), case], tmp_path, env, timeout=60)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    strip = lambda text: text.replace(str(script), "SCRIPT")  # noqa: E731 - a traceback names the file
    assert strip(forked.stderr) == strip(fresh.stderr)
    assert fresh.returncode == {"fine": 0, "user_error": 2, "bug": 1, "exit_message": 1, "exit_3": 3}[case]
    assert f"argv ['{case}'] cwd {tmp_path} path0 True" in forked.stdout and "atexit ran" in forked.stdout
    assert f"env {case} stdin '' main __main__" in forked.stdout


def test_a_launch_past_its_time_is_killed(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([str(script)], tmp_path, dict(os.environ), timeout=2)


def test_which_launches_are_forked(tmp_path, monkeypatch):
    monkeypatch.delenv("NANOGPT_TESTS_FRESH", raising=False)
    assert forkserver.usable("train.py", 1, None, ROOT, ROOT)
    assert forkserver.usable(os.path.join("data", "text", "prepare.py"), 1, None, ROOT, ROOT)
    assert forkserver.usable("train.py", 2, None, ROOT, ROOT)  # torchrun, in a fork, with forked workers
    assert not forkserver.usable("train.py", 2, None, ROOT, ROOT, check=False)  # how torchrun reports a failure
    assert forkserver.usable("train.py", 1, {"HF_HOME": "h", "WANDB_MODE": "offline"}, ROOT, ROOT)  # read later
    for name in ("PYTHONPATH", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):  # read as Python or torch starts
        assert not forkserver.usable("train.py", 1, {name: "1"}, ROOT, ROOT)
    assert not forkserver.usable("-c", 1, None, ROOT, ROOT)
    assert not forkserver.usable(str(tmp_path / "x.py"), 1, None, ROOT, ROOT)  # not the repository's
    monkeypatch.setenv("NANOGPT_TESTS_FRESH", "1")
    assert not forkserver.usable("train.py", 1, None, ROOT, ROOT)


def test_a_forked_torchrun_launch_trains_and_prints_as_torchrun_does(tmp_path):
    data = write_ids_dataset(tmp_path / "data", counting_ids(6000), "abcdefghijklmnop")
    args = [f"--data_dir={data}", *flags(**tiny(max_iters=3, eval_interval=3, gradient_accumulation_steps=2))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ends = {}
    for how in ("torchrun", "forked"):
        out = [f"--out_dir={tmp_path / how}", *args]
        if how == "torchrun":
            r = subprocess.run([*TORCHRUN, "--nproc_per_node=2", "train.py", *out], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=240)
        else:
            r = forkserver.run_torchrun("train.py", out, 2, ROOT, env, 240)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        steps = [line.split(",")[0] for line in r.stdout.splitlines() if line.startswith(("iter ", "step "))]
        ends[how] = ([row["loss"] for row in log_rows(tmp_path / how)], steps)
    assert ends["forked"] == ends["torchrun"] and len(ends["forked"][0]) == 3  # rank 0's lines, once each
