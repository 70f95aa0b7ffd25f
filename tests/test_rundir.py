"""
One run per out_dir (a lock naming the holder, taken over from a dead one; the folder's own lock when run.lock
was removed by hand; a save refused once another run has claimed the folder), a new run never mixes with or
deletes an earlier run's log and checkpoints (they are moved aside under a dated name), the checks touch
nothing, and a run that fails before it starts leaves the disk as it found it.
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

from gpt.checkpoint import rundir  # noqa: E402
from gpt.runtime.errors import UserError  # noqa: E402

HOLDER = "import sys, time; sys.path.insert(0, sys.argv[1]); from gpt.checkpoint import rundir; " \
         "rundir.claim(sys.argv[2], fresh=False); print('held', flush=True); time.sleep(120)"
TINY = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
        "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=1", "--eval_interval=2",
        "--max_iters=2", "--dataset=tiny", "--dtype=float32"]


def start_holder(out_dir):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, ROOT, str(out_dir)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def held_out_dir(tmp_path):
    """A tiny dataset, and an out_dir that another live process holds: (data folder, out_dir, the holder)."""
    ids = np.random.default_rng(0).integers(0, 16, 2000)
    d = write_ids_dataset(tmp_path / "data", ids, "abcdefghijklmnop", val=500/2000)
    out = tmp_path / "out"
    out.mkdir()
    return d, out, start_holder(out)


def train_into(data_dir, out_dir):
    return subprocess.run([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_a_second_run_is_refused_and_a_dead_ones_lock_taken_over(tmp_path, capsys):
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(UserError) as e:
            rundir.claim(str(tmp_path), fresh=False)
        assert f"in use by another run (PID {holder.pid} on host {socket.gethostname()}" in str(e.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    held = rundir.claim(str(tmp_path), fresh=False)  # the holder died without releasing it: taken over, with a line
    try:
        assert f"taking over {tmp_path / 'run.lock'} from a run that ended without releasing it (PID " \
               f"{holder.pid}" in capsys.readouterr().out
    finally:
        held.release()
    assert not (tmp_path / "run.lock").exists()  # a clean end removes it: no note next time
    rundir.claim(str(tmp_path), fresh=False).release()
    assert "taking over" not in capsys.readouterr().out


def test_train_py_refuses_a_held_out_dir(tmp_path):
    d, out, holder = held_out_dir(tmp_path)
    try:
        r = train_into(d, out)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: out_dir {out} is in use by another run (PID "
                                                        f"{holder.pid} on host")
    # the same command once the other run is gone trains; again, it keeps the first run aside
    for _ in range(2):
        r = train_into(d, out)
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


def test_check_touches_nothing(tmp_path):
    new = tmp_path / "a" / "b" / "out"
    rundir.check(str(new), fresh=True)  # can be made: fine, and nothing is made
    assert os.listdir(tmp_path) == []
    (tmp_path / "file").write_text("x")
    for bad, words in ((tmp_path / "file", "is a file, not a folder"), (tmp_path / "file" / "out", "is a file")):
        with pytest.raises(UserError, match=words):
            rundir.check(str(bad), fresh=True)
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user whom permissions do not stop (root)")
        with pytest.raises(UserError, match=rf"out_dir {locked / 'out'} cannot be made \({locked} is not writable"):
            rundir.check(str(locked / "out"), fresh=True)
        with pytest.raises(UserError):
            rundir.claim(str(locked / "out"), fresh=True)
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_undo_puts_the_disk_back(tmp_path, capsys):
    new = tmp_path / "a" / "out"
    rundir.claim(str(new), fresh=True).undo()  # made two folders: both go
    assert os.listdir(tmp_path) == []
    out = tmp_path / "out"
    out.mkdir()
    for name in ("ckpt.pt", "log.jsonl", "notes.txt"):
        (out / name).write_text(name)
    held = rundir.claim(str(out), fresh=True)
    assert not (out / "ckpt.pt").exists() and (out / "run.lock").exists()
    held.undo()
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl", "notes.txt"]
    assert [(out / n).read_text() for n in ("ckpt.pt", "log.jsonl")] == ["ckpt.pt", "log.jsonl"]
    assert f"the earlier run's ckpt.pt, log.jsonl are back in {out}" in capsys.readouterr().out
    held = rundir.claim(str(out), fresh=True)
    held.settle()  # the run started: undo leaves everything be
    held.undo()
    held.release()
    assert not (out / "ckpt.pt").exists() and len([f for f in os.listdir(out) if f.startswith("earlier-")]) == 1


def test_a_run_that_fails_before_its_first_step_leaves_the_disk_as_it_found_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("ckpt.pt", "log.jsonl"):
        (out / name).write_text(name)
    for folder in (out, tmp_path / "new" / "out"):  # no such dataset: it fails after claiming out_dir
        r = subprocess.run([sys.executable, "train.py", *TINY, f"--data_dir={tmp_path / 'nodata'}",
                            f"--out_dir={folder}"], cwd=ROOT, capture_output=True, text=True, timeout=240)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1].startswith("error: "), r.stderr
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl"] and (out / "ckpt.pt").read_text() == "ckpt.pt"
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no empty folders left behind


FAILING = "import sys; sys.path.insert(0, sys.argv[1]); from gpt.runtime import errors; errors.install(); " \
          "errors.on_failure(lambda: print('undone', flush=True)); errors.on_failure(lambda: 1 / 0); " \
          "raise errors.UserError('it failed')"


def test_on_failure_runs_before_the_error_line():
    r = subprocess.run([sys.executable, "-c", FAILING, ROOT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "undone\n", r
    # a callback that fails says so in a note, and the error that ended the run stays the last line
    assert r.stderr.splitlines() == ["note: could not undo what the run changed (ZeroDivisionError: division by "
                                     "zero)", "error: it failed"], r.stderr
    r = subprocess.run([sys.executable, "-c", FAILING.replace("raise errors.UserError('it failed')", "pass"), ROOT],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""  # a clean end calls nothing


def test_a_removed_lock_file_does_not_let_a_second_run_in(tmp_path):
    """The issue's case: run.lock removed by hand while a run is live; a second run must not move its files."""
    d, out, holder = held_out_dir(tmp_path)
    try:
        for name in ("ckpt.pt", "log.jsonl"):  # the live run's files
            (out / name).write_text(name)
        os.remove(out / "run.lock")
        before = sorted(os.listdir(out))
        with pytest.raises(UserError) as e:
            rundir.check(str(out), fresh=True)
        pid = f"PID {holder.pid} " if os.path.exists("/proc/locks") else ""
        assert f"out_dir {out} is in use by another run ({pid}" in str(e.value)
        r = train_into(d, out)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().startswith(f"error: out_dir {out} is in use by another run ({pid}") \
            and r.stderr.count("\n") == 1, r.stderr
        assert sorted(os.listdir(out)) == before and (out / "ckpt.pt").read_text() == "ckpt.pt"
    finally:
        holder.kill()
        holder.wait()


def save_into(saver):
    import torch
    model = torch.nn.Linear(2, 2)
    return saver.save(model, torch.optim.AdamW(model.parameters()), iter_num=5, model_args={})


def test_a_live_run_never_writes_into_a_folder_another_run_claimed(tmp_path):
    from gpt import checkpoint
    out = tmp_path / "out"
    held = rundir.claim(str(out), fresh=True)
    saver = checkpoint.Saver(str(out), held)
    try:
        assert held.owner_problem() is None and save_into(saver)
        os.remove(out / "run.lock")  # removed by hand: the folder lock still says it is ours
        assert held.owner_problem() is None and save_into(saver)
        (out / "ckpt.pt").write_text("the other run's")  # another run claimed it (as one could where the
        (out / "run.lock").write_text("PID 4242 on host elsewhere, since 2026-01-01T00:00:00, run abc\n")
        with pytest.raises(UserError) as e:  # folder lock cannot be had: NFS), and wrote its checkpoint
            save_into(saver)
        assert str(e.value).startswith(f"not saving to {out}: another run has claimed {out} (PID 4242 on host "
                                       f"elsewhere, since 2026-01-01T00:00:00, run abc); this run stops")
        assert (out / "ckpt.pt").read_text() == "the other run's"
        held.release()  # and never removes that run's lock file
        assert (out / "run.lock").exists()
        os.rename(out, tmp_path / "moved")  # out_dir replaced by another folder of the same name
        held = rundir.claim(str(out), fresh=True)
        stale = rundir.Claim(str(out))
        stale.folder = (os.stat(tmp_path / "moved").st_dev, os.stat(tmp_path / "moved").st_ino)
        assert "is no longer the folder this run claimed" in stale.owner_problem()
    finally:
        held.release()


@pytest.mark.parametrize("fresh", [True, False])
def test_a_link_where_the_run_writes_is_refused_before_the_claim(tmp_path, fresh):
    """A symbolic link at run.lock, log.jsonl or a checkpoint would have the run write into what it points to."""
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("run.lock", "log.jsonl", "ckpt.pt", "ckpt-0000010.pt", "ckpt_dcp"):
        (out / name).symlink_to(target)
        for call in (rundir.check, rundir.claim):
            with pytest.raises(UserError) as e:
                call(str(out), fresh=fresh)
            assert str(e.value).startswith(f"{out / name} (a link to {target}): a run writes its own files in "
                                           f"out_dir, never through a link; remove it"), str(e.value)
            assert "\n" not in str(e.value)
        assert os.listdir(out) == [name] and target.read_text() == "keep me"  # nothing claimed, nothing moved
        os.remove(out / name)


def test_a_linked_out_dir_is_the_users_choice(tmp_path):
    real = tmp_path / "scratch" / "run"
    real.mkdir(parents=True)
    (real / "log.jsonl").write_text("an earlier run's")
    (tmp_path / "out").symlink_to(real)
    held = rundir.claim(str(tmp_path / "out"), fresh=True)
    try:
        assert (real / "run.lock").exists() and held.owner_problem() is None
        (aside,) = [f for f in os.listdir(real) if f.startswith("earlier-")]
        assert (real / aside / "log.jsonl").read_text() == "an earlier run's"
    finally:
        held.release()
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")  # a link to nothing: said as such, nothing made
    with pytest.raises(UserError, match=f"out_dir {tmp_path / 'gone'} is a link to {tmp_path / 'nowhere'}, which "
                                        f"does not exist"):
        rundir.claim(str(tmp_path / "gone"), fresh=True)
    assert not (tmp_path / "nowhere").exists()


def test_run_lock_is_never_opened_through_a_link_nor_shared_with_a_hard_linked_copy(tmp_path):
    out, copy = tmp_path / "out", tmp_path / "copy"
    out.mkdir()
    copy.mkdir()
    (copy / "run.lock").write_text("the copy's\n")
    os.link(copy / "run.lock", out / "run.lock")  # as `cp -al copy out` leaves it
    held = rundir.claim(str(out), fresh=False)
    try:
        assert (copy / "run.lock").read_text() == "the copy's\n"  # the run made a run.lock of its own
        assert (out / "run.lock").read_text().startswith(f"PID {os.getpid()} ")
    finally:
        held.release()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    late = rundir.Claim(str(out))
    (out / "run.lock").symlink_to(target)  # one that appeared after the check
    with pytest.raises(UserError, match="a link to"):
        late.hold()
    assert target.read_text() == "keep me"
