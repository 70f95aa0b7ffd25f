"""
train.py on a sharded GPT-2-BPE dataset with the build-nanogpt extras on: sequential shard loading,
HellaSwag and samples during training, the training log; exact resume from the loader's position. The loss
evaluation's share of batches per rank, and a signal during an evaluation.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, counting_ids, flags, log_rows, run, tiny, write_ids_dataset

from gpt.data.sources import write_shard
from gpt.training import evaluation, hellaswag_eval
from model import GPT, GPTConfig

TINY = tiny(dropout=0.1, dataset="tinyshards")

HELLASWAG = [
    {"ind": i, "activity_label": "Cooking", "ctx_a": "A man is in a kitchen.", "ctx_b": "he",
     "ctx": "A man is in a kitchen. he", "split": "val", "split_type": "indomain", "label": i % 4,
     "endings": ["cuts an onion.", "sings loudly to the cat on the roof.", "sleeps.", "opens the fridge door slowly."],
     "source_id": f"x~{i}"}
    for i in range(6)
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, gpt2_ranks_path):
    d = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    vocab = rng.choice(50257, size=64, replace=False)  # a small alphabet of real GPT-2 ids
    for i, name in enumerate(["tinyshards_val_000000", "tinyshards_train_000001", "tinyshards_train_000002"]):
        write_shard(d / f"{name}.bin", vocab[(np.arange(3000) * 7 + i) % 64])
    (d / "meta.json").write_text(json.dumps({"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16",
                                             "eot": 50256, "format": "shards"}))
    with open(d / "hellaswag_val.jsonl", "w") as f:
        f.writelines(json.dumps(example) + "\n" for example in HELLASWAG)
    return d


@pytest.fixture(scope="module")
def char_shards(tmp_path_factory):
    """A sharded character dataset: what needs no GPT-2 tokenizer runs on it."""
    return write_ids_dataset(tmp_path_factory.mktemp("char_shards"), counting_ids(8000, stride=7), "abcdefghijklmnop",
                             val=0.2, shards=True)


def train(shards, out_dir, **kw):
    # HELLASWAG_DIR: where its hellaswag_val.jsonl is
    return run("train.py", f"--data_dir={shards}", f"--out_dir={out_dir}", *flags(**{**TINY, **kw}),
               env={"HELLASWAG_DIR": str(shards)})


def test_samples_and_hellaswag_during_training_leave_the_losses_alone(shards, tmp_path):
    plain, extras = tmp_path / "plain", tmp_path / "extras"
    train(shards, plain, max_iters=8)
    r = train(shards, extras, max_iters=8, sample_interval=4, num_samples_train=2, sample_max_tokens=8,
              hellaswag_interval=4)
    # the same losses, bitwise, with sampling and HellaSwag on: they draw on no training random stream
    assert [(x["loss"], x["grad_norm"]) for x in log_rows(plain, "train")] == \
           [(x["loss"], x["grad_norm"]) for x in log_rows(extras, "train")]
    samples = log_rows(extras, "sample")
    assert [s["step"] for s in samples] == [4, 8]  # none at step 0: untrained weights
    assert all(len(s["samples"]) == 2 and all(t.startswith("Hello, I'm a language model,") for t in s["samples"])
               for s in samples)
    assert 'sample 4: "Hello, I\'m a language model,' in r.stdout  # repr: one line per sample
    evals = log_rows(extras, "eval")
    assert [e["step"] for e in evals] == [0, 4, 8]
    for e in evals:
        assert 0 <= e["hellaswag"] <= 1 and 0 <= e["hellaswag_acc"] <= 1
        assert e["perplexity"] == pytest.approx(np.exp(e["val_loss"]))
    assert "hellaswag" in r.stdout.split("step 8:")[1].splitlines()[0]


def test_sharded_training_resumes_at_the_next_unseen_window(char_shards, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(char_shards, whole, max_iters=12)
    train(char_shards, halves, max_iters=6)
    train(char_shards, halves, max_iters=12, init_from="resume")
    a, b = log_rows(whole, "train"), log_rows(halves, "train")
    assert [x["step"] for x in b] == list(range(12))
    assert [x["loss"] for x in a] == [x["loss"] for x in b]
    ca = torch.load(whole / "ckpt.pt", weights_only=True)
    cb = torch.load(halves / "ckpt.pt", weights_only=True)
    assert ca["train_loader"] == cb["train_loader"]
    # 12 steps of 4 x 32 tokens from the first train shard, in order: the 13th window (fetched, not yet
    # trained on) starts at 12 x 128
    assert {k: ca["train_loader"][k] for k in ("shard", "offset", "epoch")} == {"shard": 0, "offset": 12 * 128,
                                                                                "epoch": 0}
    for k in ca["model"]:
        assert torch.equal(ca["model"][k], cb["model"][k]), k


def test_checkpoint_interval(char_shards, tmp_path):
    out = tmp_path / "out"
    r = train(char_shards, out, max_iters=10, checkpoint_interval=4, always_save_checkpoint=False, keep_checkpoints=5)
    # every 4 steps and at the end, whatever the validation loss did
    assert sorted(f for f in os.listdir(out) if f.startswith("ckpt-")) == \
           ["ckpt-0000004.pt", "ckpt-0000008.pt", "ckpt-0000010.pt"]
    assert r.stdout.count("saving checkpoint") == 3


class Numbered:
    """A loader whose k-th batch holds k: the fake model's loss on it says which batch it was."""

    def __init__(self):
        self.k = 0

    def next_batch(self):
        self.k += 1
        return torch.full((1, 1), self.k - 1), None

    def skip(self):
        self.k += 1


class LossOfBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, y):
        self.seen.append(int(x))
        return None, torch.tensor(1.0 + (int(x) % 7) / 3)  # not equal: a batch taken twice changes the mean


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("eval_iters", [1, 2, 3, 5, 8])
def test_ranks_share_one_process_batches_and_get_its_loss(monkeypatch, world, eval_iters):
    """Rank r of N evaluates batches r, r+N, ... of one process's sequence; the losses, summed over the ranks
    (each batch's from one rank, zeros from the rest), give one process's mean bit for bit. Every rank runs as
    many forwards (FSDP gathers weights in each): where eval_iters does not divide, the short ranks run one
    more batch, past eval_iters, whose loss is not counted. Simulated: each rank's run records its losses,
    and the fake all_reduce sums what every rank handed it."""
    one = evaluation.estimate_loss(LossOfBatch(), lambda split: Numbered(), eval_iters, torch.no_grad(), "cpu")
    reduced = {}  # call number -> every rank's tensor

    def all_reduce(t, op=None):
        reduced.setdefault(len(calls), []).append(t.clone())
        calls.append(1)
    monkeypatch.setattr(evaluation.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(evaluation.dist, "get_world_size", lambda: world)
    monkeypatch.setattr(evaluation.dist, "all_reduce", all_reduce)
    models = []
    for rank in range(world):
        calls = []
        monkeypatch.setattr(evaluation.dist, "get_rank", lambda rank=rank: rank)
        models.append(LossOfBatch())
        evaluation.estimate_loss(models[-1], lambda split: Numbered(), eval_iters, torch.no_grad(), "cpu")
    rounds = -(-eval_iters // world)
    for rank, model in enumerate(models):
        assert len(model.seen) == 2 * rounds  # the same count on every rank, both splits
        assert [b for b in model.seen[:rounds] if b < eval_iters] == list(range(rank, eval_iters, world))
    if world == 1:
        assert not reduced
        return
    summed = [torch.stack(reduced[i]).sum(0) for i in (0, 1)]  # train, then val
    for split, total in zip(("train", "val"), summed):
        assert total.mean().item() == one[split]


@pytest.mark.parametrize("sig, eval_only", [(signal.SIGINT, False), (signal.SIGTERM, True)])
def test_a_signal_during_an_evaluation_stops_within_seconds(char_shards, tmp_path, sig, eval_only):
    """Ctrl-C or SIGTERM in a long evaluation (here step 0's, of 10^6 batches) is answered between two batches:
    the evaluation is abandoned - no eval row, no best val loss from a partial mean - and the run saves and
    exits as a stop between steps does (eval_only: nothing written), resumable from there."""
    out = tmp_path / "out"
    cmd = [sys.executable, "train.py", f"--data_dir={char_shards}", f"--out_dir={out}",
           *flags(**{**TINY, "max_iters": 4, "eval_iters": 10**6, "eval_only": eval_only})]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:  # printed just before the loop, whose first act is the evaluation
            if line.startswith("config:"):
                break
        time.sleep(2)
        proc.send_signal(sig)
        t0 = time.time()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a run that did not stop does not outlive the test
    assert time.time() - t0 < 10, "the signal waited for the evaluation"
    assert proc.returncode == 128 + sig and "Traceback" not in stderr, stderr[-2000:]
    assert "step 0:" not in stdout  # no loss printed from a part of the batches
    if eval_only:
        assert not out.exists() or os.listdir(out) == []
        return
    assert "stopped at iteration 0; continue with the same command plus --init_from=resume" in stdout, stdout[-2000:]
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    assert ckpt["iter_num"] == 0 and ckpt["best_val_loss"] == 1e9  # none yet: the evaluation was abandoned
    assert log_rows(out, "eval") == [] and log_rows(out, "end")[0]["stopped"]
    train(char_shards, out, max_iters=2, eval_iters=2, init_from="resume")
    assert [row["step"] for row in log_rows(out)] == [0, 1]


class Bytes:
    def encode(self, text):
        return [b % 64 for b in text.encode()]


def test_hellaswag_asks_every_rank_alike_whether_to_stop():
    """HellaSwag's ranks score unequal shares (example i on rank i % N), but ask stop() - a collective in
    train.py - as many times each; a stop abandons it (None, never partial counts)."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=64, dropout=0.0))
    examples = HELLASWAG * 2 + HELLASWAG[:1]  # 13: ranks of 3 get 5, 4, 4 examples, 3, 2, 2 batches of 2
    asked = []
    for rank in range(3):
        asked.append(0)

        def stop():
            asked[-1] += 1
            return False
        result = hellaswag_eval.evaluate(model, examples, Bytes(), "cpu", None, rank, 3, batch_examples=2, stop=stop)
        assert result["n"] == len(examples[rank::3])
    assert asked == [2, 2, 2]
    assert hellaswag_eval.evaluate(model, examples, Bytes(), "cpu", None, stop=lambda: True) is None
