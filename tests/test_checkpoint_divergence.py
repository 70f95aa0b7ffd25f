"""
A diverging run never writes over its last good checkpoint: a NaN/inf val loss or NaN/inf weights are not
saved, and the run's stop message names the checkpoint that really is good (or says there is none).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpt import checkpoint  # noqa: E402

TINY = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
        "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=1", "--log_interval=1",
        "--dataset=tiny", "--dtype=float32", "--warmup_iters=0", "--learning_rate=3e-3", "--lr_decay_iters=20"]
DIVERGE = ["--learning_rate=1e30", "--decay_lr=False", "--grad_clip=0.0", "--eval_interval=2",
           "--max_nonfinite_steps=3", "--max_iters=40"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    ids = np.random.default_rng(0).integers(0, 16, 6000).astype(np.uint16)
    ids[:5000].tofile(d / "train.bin")
    ids[5000:].tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps({"tokenizer": "char", "vocab_size": 16, "itos": list("abcdefghijklmnop")}))
    return d


def run(script, *args):
    return subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


def test_a_diverged_run_keeps_the_good_checkpoint_and_names_it(data_dir, tmp_path):
    out = tmp_path / "out"
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=10", "--eval_interval=5")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--init_from=resume", *DIVERGE)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert "val loss nan" in r.stdout and "not saving a checkpoint" in r.stdout, r.stdout[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert f"the last good checkpoint is {out / 'ckpt.pt'}, from step 10" in last, last
    ckpt = checkpoint.load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["iter_num"] == 10 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=20", "--start=a")
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout.split("tokenizer:")[-1].splitlines()[1]
    assert len(text) == 21 and set(text) <= set("abcdefghijklmnop"), r.stdout


def test_a_run_that_diverges_before_any_checkpoint_says_there_is_none(data_dir, tmp_path):
    out = tmp_path / "out"
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", *DIVERGE)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "there is no good checkpoint" in r.stderr.strip().splitlines()[-1]
    assert not (out / "ckpt.pt").exists()


class _Due:  # schedule.due's answer, as far as checkpoint.due reads it
    checkpoint, tokens = True, 0


def test_the_decision_and_the_save_refuse_nonfinite(tmp_path, capsys):
    try:
        assert checkpoint.due(10, _Due, float("nan"), 2.0, False, True, 0) == []
        assert checkpoint.due(15, _Due, None, 2.0, False, True, 5) == []  # and no save until a finite eval
        model, opt = torch.nn.Linear(2, 2), None
        checkpoint.save(str(tmp_path), model, opt, iter_num=15)
        assert "not saving a checkpoint: the val loss at step 10 was not finite" in capsys.readouterr().out
        assert checkpoint.due(20, _Due, 1.0, 2.0, False, False, 0) == [None]
        with torch.no_grad():
            model.weight[0, 0] = float("inf")
        checkpoint.save(str(tmp_path), model, torch.optim.AdamW(model.parameters()), iter_num=20)
        assert "not saving checkpoint" in capsys.readouterr().out and os.listdir(tmp_path) == []
    finally:
        checkpoint._nonfinite_eval_at = None
