"""
Progress where users wait: the BPE trainer's bars and the evaluation bar show on a terminal only; a config far
too slow for its device gets one warning line after its first step.
"""
import io
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from gpt.data.sources import write_meta, write_tokens
from gpt.runtime import hardware
from gpt.training import evaluation


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.needs("tokenizers")
def test_bpe_training_shows_progress_on_a_terminal_only(monkeypatch):
    from tokenizers import trainers

    from gpt.data.tokenizer import train_bpe
    shown = []
    real = trainers.BpeTrainer
    monkeypatch.setattr(trainers, "BpeTrainer", lambda **kw: shown.append(kw["show_progress"]) or real(**kw))
    texts = ["hello world, hello tokenizer"] * 20
    train_bpe(texts, 300)  # pytest's captured stderr is no terminal
    monkeypatch.setattr(sys, "stderr", Terminal())
    train_bpe(texts, 300)
    assert shown == [False, True]


class Batches:
    def next_batch(self):
        return torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)


class Model(torch.nn.Module):
    def forward(self, x, y):
        return None, torch.tensor(1.5)


def test_evaluation_bar_on_a_terminal_after_a_delay(monkeypatch):
    evaluate = lambda: evaluation.estimate_loss(Model(), lambda split: Batches(), 5, torch.no_grad(), "cpu")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert evaluate() == {"train": 1.5, "val": 1.5}
    assert "evaluating" not in sys.stderr.getvalue()  # quick: no bar
    monkeypatch.setattr(evaluation, "EVAL_BAR_DELAY", 0)
    evaluate()
    assert "evaluating:" in sys.stderr.getvalue() and "/10 [" in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: never
    evaluate()
    assert sys.stderr.getvalue() == ""


def test_pace_warning():
    assert hardware.pace_warning(85.0, 599_999, "cpu").startswith(
        "warning: the first step took 85.0s on cpu: the 599,999 steps left would take ~1.6 years. ")
    assert "~3 days" in hardware.pace_warning(1.0, 3 * 86400, "mps")
    assert hardware.pace_warning(85.0, 599_999, "cuda") is None  # long runs are what GPUs are for
    assert hardware.pace_warning(0.05, 5000, "cpu") is None


def test_a_run_too_slow_for_its_device_warns_once(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    write_tokens(d / "train.bin", [i % 16 for i in range(4000)])
    write_tokens(d / "val.bin", [i % 16 for i in range(600)])
    write_meta(d, {"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": list("abcdefghijklmnop")})
    # a tiny run made "too slow" by a threshold of 0 seconds: the warning comes once, after the first step
    r = subprocess.run([sys.executable, "-c", "import gpt.runtime.hardware as h; h.SLOW_RUN_SECONDS = 0; "
                        "import runpy, sys; sys.argv = ['train.py'] + sys.argv[1:]; runpy.run_path('train.py', "
                        "run_name='__main__')",
                        f"--data_dir={d}", f"--out_dir={tmp_path / 'out'}", "--n_layer=1", "--n_head=2",
                        "--n_embd=32", "--block_size=16", "--batch_size=4", "--gradient_accumulation_steps=1",
                        "--max_iters=3", "--eval_iters=1", "--warmup_iters=1", "--lr_decay_iters=3",
                        "--compile=False", "--device=cpu", "--dtype=float32"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    warnings = [line for line in r.stdout.splitlines() if line.startswith("warning: the first step took")]
    assert len(warnings) == 1 and "the 2 steps left would take ~0 hours" in warnings[0], r.stdout[-1500:]
