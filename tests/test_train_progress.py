"""
Progress where users wait: the BPE trainer's bars and the evaluation bar show on a terminal only (a line every
few seconds elsewhere); the step line's elapsed time and eta, from step times that leave out evaluations; a
config far too slow for its device gets one warning line after its first step.
"""
import io
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, flags, log_rows, run, tiny

from gpt.data.sources import write_meta, write_tokens
from gpt.runtime import hardware
from gpt.training import evaluation, step


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


def test_a_long_evaluation_prints_progress_lines_where_no_bar_shows(monkeypatch, capsys):
    evaluate = lambda: evaluation.estimate_loss(Model(), lambda split: Batches(), 5, torch.no_grad(), "cpu")
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file
    evaluate()
    assert capsys.readouterr().out == ""  # quick: no line
    monkeypatch.setattr(evaluation, "EVAL_LINE_EVERY", 0)  # as if every batch took the interval
    evaluate()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"evaluating: {k}/10 batches" for k in range(1, 11)]
    assert sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", Terminal())  # a terminal: the bar instead
    evaluate()
    assert capsys.readouterr().out == ""


class Log:
    def __init__(self):
        self.rows = []

    def write(self, **row):
        self.rows.append(row)


def test_the_step_line_says_elapsed_time_and_eta_from_the_mean_step_time(capsys):
    run = SimpleNamespace(device="cpu", device_type="cpu", master=True, micro_batch=4, micro_steps=1, max_iters=100,
                          tokens_per_iter=128, tokens_at=lambda n: 128 * n)
    meter = step.StepMeter(Log(), None, run)
    # a resumed run's launch: its first step compiles (left out of the mean), the next ones take 1s and 3s
    for local, (it, dt, elapsed) in enumerate([(40, 30.0, 65.0), (41, 1.0, 66.0), (42, 3.0, 69.0)]):
        meter.step(it, local, 2.0, 1e-3, 0.5, dt, 0, elapsed)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("(41.0%), elapsed 1m05s, eta 29m30s")  # 59 steps left at the only time known
    assert lines[1].endswith(", elapsed 1m06s, eta 58.0s")  # 58 steps of 1s
    assert lines[2].endswith(", elapsed 1m09s, eta 1m54s")  # 57 steps of the mean 2s


def test_step_times_leave_out_the_evaluations(tmp_path):
    """nanoGPT timed iteration 0 from before the first evaluation: a slow tok/s, and an eta far off. The steps
    after each evaluation (0 and 4 here, of many batches) must time the step alone."""
    d = tmp_path / "data"
    d.mkdir()
    write_tokens(d / "train.bin", [i % 16 for i in range(4000)])
    write_tokens(d / "val.bin", [i % 16 for i in range(600)])
    write_meta(d, {"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": list("abcdefghijklmnop")})
    out = tmp_path / "out"
    r = run("train.py", f"--data_dir={d}", f"--out_dir={out}",
            *flags(**tiny(n_layer=1, max_iters=6, eval_interval=4, eval_iters=1000, lr_decay_iters=6)))
    evaluation_s = log_rows(out, "startup")[0]["first_evaluation"]
    steps = log_rows(out)
    assert evaluation_s > 0.3, evaluation_s  # long enough to tell
    assert all(row["ms_per_step"] / 1000 < evaluation_s / 3 for row in steps), (evaluation_s, steps)
    assert all(", elapsed " in line and ", eta " in line for line in r.stdout.splitlines() if line.startswith("iter "))


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
