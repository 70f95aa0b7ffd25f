"""
Corruption is caught on load: checkpoints are zip files whose entries carry CRC-32s (torch.save writes them,
torch.load never checks them); load_checkpoint reads them back. A damaged file is one error naming it and
the intact copy to go back to.
"""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpt.checkpoint import load_checkpoint  # noqa: E402
from gpt.runtime.errors import UserError  # noqa: E402


def ckpt(i):
    g = torch.Generator().manual_seed(i)
    return {"model": {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(64, 64, generator=g)}}},
            "model_args": {"n_layer": 1}, "iter_num": i, "config": {"dataset": "x"}}


def same(a, b):
    return a["iter_num"] == b["iter_num"] and all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"]) \
        and torch.equal(a["optimizer"]["state"][0]["exp_avg"], b["optimizer"]["state"][0]["exp_avg"])


def flip(path, at, n=64):
    with open(path, "r+b") as f:
        f.seek(at)
        data = bytearray(f.read(n))
        f.seek(at)
        f.write(bytes(b ^ 0xA5 for b in data))


def test_a_flip_anywhere_is_caught_or_harmless(tmp_path):
    """64 bytes XOR-flipped at 40 places spread over the whole file, and every 16 bytes over its zip headers
    and its central directory (the last 1.2 KB): every load fails with one line naming the file, or (a flip in
    the zip's unused padding) gives exactly what was saved - never other values, never a traceback."""
    path = str(tmp_path / "ckpt.pt")
    torch.save(ckpt(1), path)
    blob = open(path, "rb").read()
    places = [k * (len(blob) - 64) // 39 for k in range(40)]
    places += list(range(0, 256, 16)) + list(range(len(blob) - 1200, len(blob) - 64, 16))
    caught = 0
    for at in places:
        with open(path, "wb") as f:
            f.write(blob)
        flip(path, at)
        try:
            loaded = load_checkpoint(path)
        except UserError as e:
            assert str(e).startswith(path) and "\n" not in str(e)
            caught += 1
        else:
            assert same(loaded, ckpt(1)), f"a flip at byte {at} loaded silently"
    assert caught >= 0.8 * len(places), (caught, len(places))


def test_the_error_names_the_newest_intact_copy(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    for i in (5, 10):
        torch.save(ckpt(i), tmp_path / f"ckpt-{i:07d}.pt")
    os.utime(tmp_path / "ckpt-0000005.pt", (1, 1))  # the older one
    os.link(tmp_path / "ckpt-0000010.pt", path)  # keep_checkpoints' newest copy is ckpt.pt itself
    flip(path, os.path.getsize(path) // 2)
    with pytest.raises(UserError) as e:
        load_checkpoint(path)
    assert "is corrupted" in str(e.value) and "CRC-32" in str(e.value)
    assert f"cp {tmp_path / 'ckpt-0000005.pt'} {path}" in str(e.value)
    os.remove(tmp_path / "ckpt-0000005.pt")
    with pytest.raises(UserError, match="no intact copy is kept beside it .keep_checkpoints=N"):
        load_checkpoint(path)


def test_checkpoints_without_a_zip_still_load(tmp_path):
    """nanoGPT's checkpoints are zip files too; the legacy (pre-zip) format has no CRCs and still loads."""
    torch.save(ckpt(3), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert same(load_checkpoint(str(tmp_path / "legacy.pt")), ckpt(3))


def test_an_unsafe_checkpoint_names_what_was_refused_not_torchs_advice(tmp_path):
    import argparse
    torch.save({**ckpt(1), "args": argparse.Namespace(lr=1.0)}, tmp_path / "ckpt.pt")
    with pytest.raises(UserError) as e:
        load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert "unsafe" in str(e.value) and "argparse.Namespace" in str(e.value) and "could run code" in str(e.value)
    assert "weights_only" not in str(e.value) and "Re-running" not in str(e.value)
