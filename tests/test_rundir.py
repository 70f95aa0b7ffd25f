"""
One run per out_dir (a lock naming the holder, taken over from a dead one), and a new run never mixes with
or deletes an earlier run's log and checkpoints: they are moved aside under a dated name.
"""
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from conftest import write_ids_dataset

from gpt import rundir  # noqa: E402
from gpt.errors import UserError  # noqa: E402

HOLDER = "import sys, time; sys.path.insert(0, sys.argv[1]); from gpt import rundir; rundir.hold(sys.argv[2]); " \
         "print('held', flush=True); time.sleep(120)"
TINY = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
        "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=1", "--eval_interval=2",
        "--max_iters=2", "--dataset=tiny", "--dtype=float32"]


def start_holder(out_dir):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, ROOT, str(out_dir)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_run_is_refused_and_a_dead_ones_lock_taken_over(tmp_path, capsys):
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(UserError) as e:
            rundir.hold(str(tmp_path))
        assert f"in use by another run (PID {holder.pid} on host {socket.gethostname()}" in str(e.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    try:
        rundir.hold(str(tmp_path))  # the holder died without releasing it: taken over, with a line
        assert f"taking over {tmp_path / 'run.lock'} from a run that ended without releasing it (PID " \
               f"{holder.pid}" in capsys.readouterr().out
    finally:
        rundir.release()
    assert not (tmp_path / "run.lock").exists()  # a clean end removes it: no note next time
    rundir.hold(str(tmp_path))
    rundir.release()
    assert "taking over" not in capsys.readouterr().out


def test_train_py_refuses_a_held_out_dir(tmp_path):
    ids = np.random.default_rng(0).integers(0, 16, 2000)
    d = write_ids_dataset(tmp_path / "data", ids, "abcdefghijklmnop", val=500/2000)
    out = tmp_path / "out"
    out.mkdir()
    holder = start_holder(out)
    try:
        r = subprocess.run([sys.executable, "train.py", *TINY, f"--data_dir={d}", f"--out_dir={out}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=240)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: out_dir {out} is in use by another run (PID "
                                                        f"{holder.pid} on host")
    # the same command once the other run is gone trains; again, it keeps the first run aside
    for _ in range(2):
        r = subprocess.run([sys.executable, "train.py", *TINY, f"--data_dir={d}", f"--out_dir={out}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
    aside = [f for f in os.listdir(out) if f.startswith("earlier-")]
    assert len(aside) == 1 and f"its ckpt.pt, log.jsonl are kept in {out / aside[0]}" in r.stdout
    assert sorted(os.listdir(out)) == sorted([aside[0], "ckpt.pt", "log.jsonl"])  # the lock is gone at the end
    for folder in (out, out / aside[0]):  # each log holds one run: steps 0 and 2 evaluated once
        rows = [json.loads(line) for line in open(folder / "log.jsonl")]
        assert [row["step"] for row in rows if row["kind"] == "eval"] == [0, 2]
        assert (folder / "ckpt.pt").exists()


def test_set_aside_keeps_every_file_of_the_earlier_run(tmp_path):
    for name in ("log.jsonl", "ckpt.pt", "ckpt-0000010.pt", "ckpt-tok4096-val1.2000.pt", "notes.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "ckpt_dcp").mkdir()
    first = rundir.set_aside(str(tmp_path))
    assert sorted(os.listdir(first)) == ["ckpt-0000010.pt", "ckpt-tok4096-val1.2000.pt", "ckpt.pt", "ckpt_dcp",
                                         "log.jsonl"]
    assert (tmp_path / "notes.txt").exists() and rundir.set_aside(str(tmp_path)) is None  # nothing left to move
    (tmp_path / "log.jsonl").write_text("second")
    second = rundir.set_aside(str(tmp_path))
    assert second != first and (open(os.path.join(second, "log.jsonl")).read() == "second")
