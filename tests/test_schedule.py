"""
The learning-rate schedule and the token budget: max_tokens / warmup_tokens / lr_decay_tokens give the same
run as the iteration settings they stand for, stop at the right step, and are logged with the percent done;
ckpt_every_tokens keeps checkpoints named with tokens and val loss, the last keep_checkpoints of them.
"""
import os
import re

import pytest
from conftest import flags, log_rows, run, tiny

from gpt.checkpoint import load_checkpoint
from gpt.data.sources import write_meta, write_tokens
from gpt.runtime.errors import UserError
from gpt.training import schedule

# the schedule's own settings (warmup, decay) are each test's
TINY = {k: v for k, v in tiny(n_layer=1, n_embd=16, block_size=16, eval_interval=100, learning_rate=1e-2,
                              min_lr=1e-3, dataset="tiny").items() if k not in ("warmup_iters", "lr_decay_iters")}
TOKENS_PER_ITER = 4 * 16
DEFAULTS = dict(max_iters=600000, warmup_iters=2000, lr_decay_iters=600000)


def settings(**kw):
    return {**DEFAULTS, "max_tokens": 0, "warmup_tokens": 0, "lr_decay_tokens": 0, **kw}


def test_get_lr_warms_up_decays_and_stays_at_min_lr():
    lr = lambda it: schedule.get_lr(it, 1.0, 0.1, 10, 110)
    assert lr(0) == pytest.approx(1 / 11) and lr(9) == pytest.approx(10 / 11)
    assert lr(10) == pytest.approx(1.0) and lr(60) == pytest.approx(0.55) and lr(110) == lr(500) == 0.1


def test_tokens_become_iterations():
    it = lambda **kw: schedule.iterations(settings(**kw), 1000, given=set(kw), verbose=False)
    assert it() == (600000, 2000, 600000)  # nothing in tokens: the iteration settings as they are
    assert it(max_iters=50, lr_decay_iters=40) == (50, 2000, 40)
    # the budget rounds up (the run stops at the first step that reaches it); the decay ends with it
    assert it(max_tokens=10_500) == (11, 2000, 11)
    assert it(max_tokens=10_000, warmup_tokens=2000, lr_decay_tokens=8000) == (10, 2, 8)
    assert it(max_tokens=10_000, lr_decay_iters=7, warmup_iters=1) == (10, 1, 7)  # iterations may mix in
    assert it(max_tokens=10_000, max_iters=0, lr_decay_iters=0) == (10, 2000, 10)
    with pytest.raises(UserError, match="max_iters=50 and max_tokens=10000 are both set"):
        it(max_tokens=10_000, max_iters=50)
    with pytest.raises(UserError, match="warmup_iters=5 and warmup_tokens"):
        it(warmup_tokens=10, warmup_iters=5)
    with pytest.raises(UserError, match="negative"):
        it(max_tokens=-1)
    # given means set by the user, whatever the value: train.py's own default max_iters, given, still clashes
    with pytest.raises(UserError, match="max_iters=600000 and max_tokens=10000 are both set"):
        it(max_tokens=10_000, max_iters=600000)


def test_crossed_marks_the_first_step_past_each_multiple():
    steps = [n for n in range(20) if schedule.crossed(n * 64, 64, 200)]
    assert steps == [4, 7, 10, 13, 16, 19]  # 256, 448, 640, 832, 1024, 1216 tokens seen
    assert [n for n in range(5) if schedule.crossed(n * 100, 100, 100)] == [1, 2, 3, 4]
    assert not any(schedule.crossed(n * 64, 64, 0) for n in range(10))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    itos = list("abcdefghijklmnop")
    pattern = [(i * 5 + i // 16) % 16 for i in range(4000)]  # learnable, not constant
    write_tokens(d / "train.bin", pattern)
    write_tokens(d / "val.bin", pattern[:600])
    write_meta(d, {"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": itos})
    return d


def train(data_dir, out_dir, **kw):
    return run("train.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}", *flags(**{**TINY, **kw}), check=False)


def test_a_token_budget_runs_the_same_schedule_and_keeps_checkpoints(data_dir, tmp_path):
    by_iters, by_tokens = tmp_path / "iters", tmp_path / "tokens"
    a = train(data_dir, by_iters, max_iters=12, warmup_iters=3, lr_decay_iters=12)
    # 12 steps of 64 tokens cover a budget of 758; warm-up 3 steps; the decay ends with the budget
    b = train(data_dir, by_tokens, max_tokens=12 * TOKENS_PER_ITER - 10, warmup_tokens=3 * TOKENS_PER_ITER,
              ckpt_every_tokens=200, keep_checkpoints=2)
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    assert "max_tokens=758 -> max_iters=12" in b.stdout and "warmup_tokens=192 -> warmup_iters=3" in b.stdout
    train_a, train_b = log_rows(by_iters, "train"), log_rows(by_tokens, "train")
    assert [r["step"] for r in train_b] == list(range(12))  # stopped at the step that reached the budget
    assert [(r["lr"], r["loss"], r["tokens"]) for r in train_a] == [(r["lr"], r["loss"], r["tokens"]) for r in train_b]
    assert [r["percent"] for r in train_b] == pytest.approx([100 * (n + 1) / 12 for n in range(12)])
    assert re.search(r"^iter 11: .*, 768 tokens \(100\.0%\), elapsed \S+, eta \S+$", b.stdout, re.M), b.stdout[-1500:]
    # a checkpoint at the first step past each 200 tokens (steps 4, 7, 10), after an evaluation for its name;
    # the last two kept, beside ckpt.pt
    evals = {r["step"]: r for r in log_rows(by_tokens, "eval")}
    assert sorted(evals) == [0, 4, 7, 10, 12] and evals[12]["percent"] == 100.0
    kept = sorted(f for f in os.listdir(by_tokens) if f.startswith("ckpt-tok"))
    assert kept == [f"ckpt-tok{t}-val{evals[s]['val_loss']:.4f}.pt" for t, s in ((448, 7), (640, 10))]
    ckpt = load_checkpoint(str(by_tokens / kept[-1]))
    assert ckpt["iter_num"] == 10 and len(ckpt["rng"]) == 1
    assert load_checkpoint(str(by_tokens / "ckpt.pt"))["iter_num"] == 12


def test_both_settings_given_is_one_line(data_dir, tmp_path):
    r = train(data_dir, tmp_path / "out", max_iters=50, max_tokens=1000)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: max_iters=50 and max_tokens=1000 are both set: give one (--max_iters=0 " \
                               "to use max_tokens)"


def due(iter_num, max_iters=100, eval_only=False, resumed_here=False, eval_interval=10, hellaswag_interval=0,
        sample_interval=0, tokens_per_iter=64, ckpt_every_tokens=0, checkpoint_interval=0, at_start=True):
    return schedule.due(iter_num, max_iters, eval_only, resumed_here, eval_interval, hellaswag_interval,
                        sample_interval, tokens_per_iter, ckpt_every_tokens, checkpoint_interval, at_start=at_start)


def test_what_is_due_at_a_step():
    assert due(0).loss and due(20).loss and not due(21).loss and due(100).loss and due(100).last
    assert due(25, eval_interval=10, sample_interval=5).samples and not due(25).loss
    assert not due(20, resumed_here=True).loss  # the resumed run evaluated this step before saving
    assert due(20, resumed_here=True, eval_only=True).loss and due(7, eval_only=True).hellaswag is False
    assert due(7, eval_only=True, hellaswag_interval=50).hellaswag  # eval_only: everything at once
    assert due(30, checkpoint_interval=15).checkpoint and not due(31, checkpoint_interval=15).checkpoint
    assert not due(30).checkpoint and due(100, checkpoint_interval=33).checkpoint  # and at the end
    # ckpt_every_tokens: the first step past each multiple, with its loss evaluated for the name
    assert [n for n in range(12) if due(n, ckpt_every_tokens=200).tokens] == [4, 7, 10]
    assert due(4, ckpt_every_tokens=200) == (True, False, False, False, 256, False)
    assert not due(4, ckpt_every_tokens=200, resumed_here=True).tokens


def test_eval_at_start_false_skips_only_the_first_steps_evaluation():
    late = dict(at_start=False, hellaswag_interval=10)
    assert due(0, **late) == (False, False, False, False, 0, False)  # nothing at step 0
    assert due(10, **late).loss and due(10, **late).hellaswag and due(100, **late).loss  # later ones as before
    assert due(0, max_iters=0, **late).loss  # a run with no steps is still evaluated (its last step)
    assert due(0, eval_only=True, **late).loss  # eval_only evaluates the model it starts from


def test_the_checkpoint_decision():
    from gpt import checkpoint
    decide = lambda n, val, best=2.0, always=False, interval=0, eval_only=False, **kw: checkpoint.due(
        n, due(n, checkpoint_interval=interval, **kw), val, best, eval_only, always, interval)
    assert decide(10, 1.9) == [None]  # improved: ckpt.pt
    assert decide(10, 2.1) == [] and decide(10, 2.1, always=True) == [None]
    assert decide(0, 1.0) == [] and decide(10, 1.0, eval_only=True) == []  # nothing trained / nothing to save
    assert decide(11, None) == []  # no evaluation at this step
    # checkpoint_interval N: every N steps and at the end, whatever the loss; -1: never
    assert decide(15, None, interval=5) == [None] and decide(10, 1.0, interval=5) == [None]
    assert decide(16, None, interval=5) == [] and decide(100, None, interval=33) == [None]
    assert decide(10, 1.0, interval=-1) == []
    # a token checkpoint, named with the tokens seen and the val loss, besides ckpt.pt
    assert decide(4, 2.5, ckpt_every_tokens=200, always=True) == [None, "ckpt-tok256-val2.5000.pt"]


def test_the_global_batch_is_split_into_micro_batches_that_fit(capsys):
    split = lambda total, gas=40, batch=12, world=1: tuple(schedule.split_batch(total, gas, batch, 1024, world))
    # nanoGPT's 40 micro-steps of 12, a total over the processes: 40 x 12 on one, 5 x 12 on eight
    assert split(0) == (40, 12) and split(0, world=8) == (5, 12) and capsys.readouterr().out == ""
    # on three: 160 sequences each, in the fewest equal micro-batches of at most 12: 16 of 10
    assert split(0, world=3) == (16, 10)
    assert "gradient_accumulation_steps=40 x batch_size=12 -> gradient_accumulation_steps=48 (16 per process) " \
           "of 10 sequences of 1,024 tokens (batch_size=12 is the most" in capsys.readouterr().out
    # total_batch_size in tokens: build-nanogpt's 524,288 = 4 x 16 per GPU on 8; speedrun's 65,536 on 1, 2, 4, 8
    assert split(524288, batch=16, world=8) == (4, 16)
    assert [split(65536, batch=32, world=n) for n in (1, 2, 4, 8)] == [(2, 32), (1, 32), (1, 16), (1, 8)]
    assert "total_batch_size=65,536 -> gradient_accumulation_steps=8 (1 per process) of 8 sequences" \
        in capsys.readouterr().out.splitlines()[-1]
    # shakespeare_char's one micro-step of 64 on two GPUs: one of 32 each
    assert split(0, gas=1, batch=64, world=2) == (1, 32)
    # a global batch the processes cannot share: the process counts and the total_batch_size that would work
    with pytest.raises(UserError, match=r"^the global batch of 64 sequences \(total_batch_size=65,536\) cannot be "
                                        r"shared equally by 3 processes: start 1, 2, 4, 8, 16, 32, 64 of them "
                                        r"\(--nproc_per_node\), or set --total_batch_size=64,512 or 67,584 "):
        split(65536, batch=32, world=3)
    with pytest.raises(UserError, match=r"^total_batch_size=1,000 is not a whole number of sequences of "
                                        r"block_size=1,024 tokens: use 1,024$"):
        split(1000)


def test_total_batch_size_that_does_not_divide_is_one_line(data_dir, tmp_path):
    r = train(data_dir, tmp_path / "out", total_batch_size=100)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(
        "error: total_batch_size=100 is not a whole number of sequences of block_size=16 tokens: use 96 or 112")


def test_lr_schedule_shapes():
    lr = lambda it, shape, frac=0.2: schedule.get_lr(it, 1.0, 0.1, 10, 110, shape, frac, max_iters=100)
    warmup = [lr(it, "cosine") for it in range(10)]
    # every schedule warms up the same way
    assert [lr(it, "constant") for it in range(10)] == [lr(it, "wsd") for it in range(10)] == warmup
    assert warmup == pytest.approx([(it + 1) / 11 for it in range(10)])
    assert lr(10, "cosine") == pytest.approx(1.0) and lr(110, "cosine") == 0.1  # nanoGPT's, as before
    assert [lr(it, "constant") for it in (10, 50, 99, 500)] == [1.0] * 4
    # wsd: stable up to the last 20% of max_iters, then linear down to min_lr at the last step
    assert [lr(it, "wsd") for it in (10, 50, 79)] == [1.0] * 3
    assert [lr(it, "wsd") for it in (80, 89, 99)] == pytest.approx([1 - 0.9 / 20, 1 - 0.9 * 10 / 20, 0.1])
    decay = [lr(it, "wsd") for it in range(79, 100)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    assert lr(99, "wsd", frac=0.5) == pytest.approx(0.1) and lr(49, "wsd", frac=0.5) == 1.0 > lr(50, "wsd", 0.5)
    # decay_lr=False (nanoGPT): learning_rate from the first step, no warm-up
    assert [lr(it, "none") for it in (0, 5, 50, 99)] == [1.0] * 4


def test_lr_schedule_mistakes_are_one_line():
    it = lambda **kw: schedule.iterations(settings(**kw), 1000, DEFAULTS, verbose=False)
    with pytest.raises(UserError, match="unknown lr_schedule 'linear': use one of cosine, constant, wsd"):
        it(lr_schedule="linear")
    with pytest.raises(UserError, match=r"lr_decay_frac=1.5 must be in \(0, 1\]"):
        it(lr_schedule="wsd", lr_decay_frac=1.5)


def test_a_schedule_that_would_climb_to_min_lr_is_refused():
    for lr_schedule in ("cosine", "wsd"):
        with pytest.raises(UserError, match=f"min_lr=6e-05 is above learning_rate=1e-05, so the '{lr_schedule}' "
                                            f"schedule would rise to min_lr rather than decay: set --min_lr"):
            schedule.check_decay(1e-5, 6e-5, lr_schedule)
        schedule.check_decay(6e-5, 6e-5, lr_schedule)  # equal: a constant rate after warm-up, as asked
    for lr_schedule in ("constant", "none"):  # min_lr is not used
        schedule.check_decay(1e-5, 6e-5, lr_schedule)



def test_schedule_lengths_that_are_unlikely_meant_are_noted():
    assert schedule.check_lengths(100, 10, 100, 'cosine') == []
    assert schedule.check_lengths(20, 100, 20, 'cosine') == [
        "warmup_iters=100 is beyond max_iters=20: the run ends still warming up, at 21% of learning_rate"]
    assert "drops straight to min_lr" in schedule.check_lengths(200, 100, 20, 'cosine')[0]
    assert schedule.check_lengths(200, 100, 20, 'wsd') == [] and schedule.check_lengths(20, 100, 20, 'none') == []
