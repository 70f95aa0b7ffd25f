"""
A resumed model is its checkpoint's: shape settings that disagree are refused in one line, block_size
defaults to the checkpoint's, and the config the run prints and saves is the one that ran.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from conftest import write_ids_dataset

from gpt import checkpoint  # noqa: E402
from gpt.errors import UserError  # noqa: E402

BASE = ["--device=cpu", "--compile=False", "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=1",
        "--eval_interval=3", "--dataset=tiny", "--dtype=float32"]
DEFAULTS = dict(n_layer=12, n_head=12, n_embd=768, bias=False, family='gpt2', n_kv_head=0, mlp_hidden=0,
                rope_theta=10000.0, tie_embeddings=True, block_size=1024)


def resumed(**model_args):
    return {"path": "out/ckpt.pt", "model_args": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64,
                                                 "bias": False, "vocab_size": 16, **model_args}}


def test_shape_settings_that_differ_are_refused():
    with pytest.raises(UserError) as e:
        checkpoint.resume_shape(resumed(), {**DEFAULTS, "n_layer": 4, "n_embd": 128}, DEFAULTS)
    assert str(e.value) == ("the checkpoint out/ckpt.pt is a 2-layer, 64-wide model; a resumed model keeps its "
                            "shape, but this run sets n_layer=4 (checkpoint: 2), n_embd=128 (checkpoint: 64): "
                            "leave them out, or train a new model in another out_dir")
    with pytest.raises(UserError, match="family='llama' .checkpoint: 'gpt2'"):
        checkpoint.resume_shape(resumed(), {**DEFAULTS, "family": "llama"}, DEFAULTS)
    # the same values given again are fine; the config becomes the checkpoint's; block_size too, unless given
    config = {**DEFAULTS, "n_layer": 2}
    assert checkpoint.resume_shape(resumed(), config, DEFAULTS) == 64
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["block_size"]) == (2, 2, 64, 64)
    assert checkpoint.resume_shape(resumed(), {**DEFAULTS, "block_size": 32}, DEFAULTS) == 32  # crops


def test_resume_takes_the_checkpoints_block_size_and_records_what_ran(tmp_path):
    ids = np.random.default_rng(0).integers(0, 16, 3000)
    d = write_ids_dataset(tmp_path / "data", ids, "abcdefghijklmnop", val=500/3000)
    out = tmp_path / "out"
    run = lambda *a: subprocess.run([sys.executable, "train.py", *BASE, f"--data_dir={d}", f"--out_dir={out}", *a],
                                    cwd=ROOT, capture_output=True, text=True, timeout=240)
    r = run("--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--max_iters=3")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("--init_from=resume", "--max_iters=6")  # no shape flags at all: nanoGPT's block_size=1024 default
    assert r.returncode == 0, r.stderr[-2000:]
    assert "n_layer=1 n_head=2 n_embd=32" in r.stdout and "block_size=16" in r.stdout
    ckpt = checkpoint.load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["iter_num"] == 6
    assert {k: ckpt["config"][k] for k in ("n_layer", "n_head", "n_embd", "block_size")} == \
        dict(n_layer=1, n_head=2, n_embd=32, block_size=16)
