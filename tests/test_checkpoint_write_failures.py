"""
Every failure to write a checkpoint - disk full, quota, read-only, I/O error, or torch's RuntimeError that
wraps them - is one `error:` line with the previous checkpoint intact; on a real full disk (a small tmpfs,
where mounting one is permitted) too, and a run whose last save failed ends with status 2.
"""
import errno
import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from conftest import write_ids_dataset

from gpt.checkpoint import load_checkpoint, write_checkpoint  # noqa: E402


def wrapped(code):
    """torch.save's error when its zip writer hits a failed write: a RuntimeError chained from the OSError."""
    try:
        raise OSError(code, os.strerror(code))
    except OSError as e:
        try:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4736 vs 4632") from e
        except RuntimeError as r:
            return r


FAILURES = {
    "ENOSPC": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "EDQUOT": OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
    "EROFS": OSError(errno.EROFS, os.strerror(errno.EROFS)),
    "EIO": OSError(errno.EIO, os.strerror(errno.EIO)),
    "torch-wrapped-ENOSPC": wrapped(errno.ENOSPC),
    "torch-unexpected-pos": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4736 vs 4632"),
    "torch-stream-writer": RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed"),
}


# where it fails: inside torch.save (every kind), or at the fsync or the rename that follow (the OSErrors)
CASES = [(n, "torch.save") for n in FAILURES] + [(n, w) for n in FAILURES if isinstance(FAILURES[n], OSError)
                                                 for w in ("fsync", "rename")]


@pytest.mark.parametrize("name,where", CASES, ids=[f"{n}-{w}" for n, w in CASES])
def test_a_failed_write_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys, name, where):
    path = str(tmp_path / "ckpt.pt")
    assert write_checkpoint({"model": {"w": torch.ones(3)}, "model_args": {}, "iter_num": 1}, path) is None
    capsys.readouterr()
    error = FAILURES[name]
    if where == "torch.save":
        def failing_save(obj, f, *a, **k):
            f.write(b"partial bytes")
            raise error
        monkeypatch.setattr(torch, "save", failing_save)
    else:
        monkeypatch.setattr(os, "fsync" if where == "fsync" else "replace", lambda *a: (_ for _ in ()).throw(error))
    assert write_checkpoint({"model": {"w": torch.zeros(3)}, "model_args": {}, "iter_num": 2}, path)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"error: could not save checkpoint to {path} (") \
        and out[0].endswith("the previous checkpoint is kept"), out
    if isinstance(error.__cause__ or error, OSError):
        assert (error.__cause__ or error).strerror in out[0]
    monkeypatch.undo()
    ckpt = load_checkpoint(path)
    assert ckpt["iter_num"] == 1 and torch.equal(ckpt["model"]["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_other_errors_are_bugs_and_keep_their_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug in pickling")))
    with pytest.raises(RuntimeError, match="a bug"):
        write_checkpoint({"model": {}}, str(tmp_path / "ckpt.pt"))


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, where this process may mount one (root, in a container that allows it)."""
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("no mount command (not Linux)")
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {r.stderr.strip() or r.returncode}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(folder):
    """Fill the file system that holds folder to the last byte."""
    fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT)
    for size in (1 << 16, 1 << 12, 1 << 9, 1):
        try:
            while os.write(fd, b"\0" * size):
                pass
        except OSError:
            pass
    os.close(fd)


def test_a_full_disk_keeps_the_last_checkpoint(small_disk, tmp_path):
    ids = np.random.default_rng(0).integers(0, 16, 2000)
    d = write_ids_dataset(tmp_path / "data", ids, "abcdefghijklmnop", val=500/2000)
    out = small_disk / "out"
    base = [sys.executable, "train.py", "--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32",
            "--block_size=16", "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=1",
            "--eval_interval=2", "--dataset=tiny", "--dtype=float32", f"--data_dir={d}", f"--out_dir={out}"]
    r = subprocess.run(base + ["--max_iters=2"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    fill(small_disk)
    r = subprocess.run(base + ["--max_iters=6", "--init_from=resume"], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert "error: could not save checkpoint to" in r.stdout and "No space left on device" in r.stdout, r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the run's last checkpoint could not be saved") and "from step 2" in last, last
    os.remove(small_disk / "filler")
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
