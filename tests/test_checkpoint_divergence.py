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


def test_the_divergence_rule():
    rule = lambda val, best=1e9, initial=2.82: checkpoint.divergence(7, val, best, initial)
    assert "is nan" in rule(float("nan")) and "is inf" in rule(float("inf"))
    assert rule(1.6e9) and rule(1.6e9).startswith("the val loss at step 7 is 1.6e+09, above 3.8200")
    # the start: best == initial; the margin (1 nat) covers a healthy run's first bump above its initial loss
    assert rule(3.5, best=2.82) is None and rule(3.9, best=2.82)
    # later: overfitting or a spike that stays below the untrained model's loss is not divergence...
    assert rule(4.0, best=1.47, initial=4.17) is None
    # ...a loss above it is, however far the best is below
    assert "above 4.1700" in rule(4.2, best=1.47, initial=4.17)
    assert rule(3.0, best=2.5, initial=None) is None  # no initial loss known yet: this one is the first


def test_the_saver_keeps_the_good_checkpoint_and_names_it(tmp_path, capsys):
    model = torch.nn.Linear(2, 2)
    adam = torch.optim.AdamW(model.parameters())
    saver = checkpoint.Saver(str(tmp_path))
    saver.record_eval(0, 2.8, 1e9)  # the untrained model's loss
    assert saver.to_save(10, _Due, 2.0, 2.8, False, True, 0) == [None]
    assert saver.save(model, adam, iter_num=10, model_args={}) and saver.good == (str(tmp_path / "ckpt.pt"), 10)
    good = (tmp_path / "ckpt.pt").read_bytes()
    assert checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt"))["initial_val_loss"] == 2.8
    for val in (float("nan"), 1.6e9):  # NaN, and a finite loss far above the untrained model's
        capsys.readouterr()
        saver.record_eval(20, val, 2.0)
        assert f"step 20: not saving a checkpoint: the val loss at step 20 is {val:.4g}" in capsys.readouterr().out
        before = dict(vars(saver))
        for _ in range(2):  # a query: the same answer, nothing changed
            assert saver.to_save(20, _Due, val, 2.0, False, True, 0) == [] == \
                   saver.to_save(25, _Due, None, 2.0, False, True, 5)
        assert vars(saver) == before
        assert saver.save(model, adam, iter_num=25) is False  # a signal's save, or checkpoint_interval's
        assert f"the last good checkpoint is {tmp_path / 'ckpt.pt'}, from step 10" in capsys.readouterr().out
        assert (tmp_path / "ckpt.pt").read_bytes() == good
        with pytest.raises(checkpoint.UserError, match="the run ended with broken weights, not saved .* the last "
                                                       "good checkpoint is .*ckpt.pt, from step 10"):
            saver.check_end()
    saver.record_eval(30, 1.9, 2.0)  # finite and below the ceiling again: saves resume
    assert saver.to_save(30, _Due, 1.9, 2.0, False, False, 0) == [None]
    saver.check_end()
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    assert saver.save(model, adam, iter_num=30) is False  # weights holding inf are never saved either
    assert "not saving checkpoint" in capsys.readouterr().out and (tmp_path / "ckpt.pt").read_bytes() == good


def test_a_resumed_saver_knows_its_checkpoint_and_the_untrained_loss():
    ckpt = {"path": "out/ckpt.pt", "iter_num": 40, "model_args": {"vocab_size": 65}}
    saver = checkpoint.Saver("out", resumed=ckpt)
    assert saver.last_good() == "the last good checkpoint is out/ckpt.pt, from step 40"
    assert saver.initial_val_loss == pytest.approx(np.log(65))  # nanoGPT's: an untrained model's loss
    assert checkpoint.Saver("out", resumed={**ckpt, "initial_val_loss": 4.0}).initial_val_loss == 4.0


def log_val_losses(out):
    return [json.loads(line)["val_loss"] for line in open(out / "log.jsonl") if '"eval"' in line]


def test_a_finite_divergence_resumed_keeps_the_good_checkpoint(data_dir, tmp_path):
    """The issue's case: --learning_rate=1e3 resumed from a good checkpoint gives a val loss of ~1.6e9, finite."""
    out = tmp_path / "out"
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=10", "--eval_interval=5")
    assert r.returncode == 0, r.stderr[-2000:]
    good = (out / "ckpt.pt").read_bytes()
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--init_from=resume",
            "--learning_rate=1e3", "--decay_lr=False", "--eval_interval=2", "--max_iters=12")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert 1e3 < log_val_losses(out)[-1] < float("inf")  # finite: not the NaN case
    assert "saving checkpoint" not in r.stdout and "step 12: not saving a checkpoint" in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the run ended with broken weights, not saved (the val loss at step 12 is")
    assert f"the last good checkpoint is {out / 'ckpt.pt'}, from step 10" in last, last
    assert (out / "ckpt.pt").read_bytes() == good


def test_a_finite_divergence_fresh_writes_nothing(data_dir, tmp_path):
    out = tmp_path / "out"
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=10", "--eval_interval=5")
    assert r.returncode == 0, r.stderr[-2000:]
    good = (out / "ckpt.pt").read_bytes()
    r = run("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--learning_rate=1e3",
            "--decay_lr=False", "--eval_interval=2", "--max_iters=2")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert 1e3 < log_val_losses(out)[-1] < float("inf")
    aside = [f for f in os.listdir(out) if f.startswith("earlier-")]
    assert len(aside) == 1 and (out / aside[0] / "ckpt.pt").read_bytes() == good
    assert not (out / "ckpt.pt").exists()
    last = r.stderr.strip().splitlines()[-1]
    assert f"there is no good checkpoint: this run wrote none to {out} (an earlier run's is kept in " \
           f"{out / aside[0]})" in last, last
