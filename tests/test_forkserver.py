"""tests/forkserver.py, which most tests' script launches go through: a forked launch ends as a fresh
interpreter's would, the same status, stdout and stderr, for each way a script can end, and sees its own
argv, working folder, environment, sys.path[0] and an empty stdin."""
import os
import subprocess
import sys

import forkserver
import pytest
from conftest import ROOT

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


def test_only_a_repository_script_in_one_process_is_forked(tmp_path, monkeypatch):
    monkeypatch.delenv("NANOGPT_TESTS_FRESH", raising=False)
    assert forkserver.usable("train.py", 1, None, ROOT, ROOT)
    assert forkserver.usable(os.path.join("data", "text", "prepare.py"), 1, None, ROOT, ROOT)
    assert not forkserver.usable("train.py", 2, None, ROOT, ROOT)  # torchrun
    assert not forkserver.usable("train.py", 1, {"WANDB_MODE": "offline"}, ROOT, ROOT)  # variables of its own
    assert not forkserver.usable("-c", 1, None, ROOT, ROOT)
    assert not forkserver.usable(str(tmp_path / "x.py"), 1, None, ROOT, ROOT)  # not the repository's
    monkeypatch.setenv("NANOGPT_TESTS_FRESH", "1")
    assert not forkserver.usable("train.py", 1, None, ROOT, ROOT)
