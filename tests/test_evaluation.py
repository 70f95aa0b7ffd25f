"""
train.py on a sharded GPT-2-BPE dataset with the build-nanogpt extras on: sequential shard loading,
HellaSwag and samples during training, the training log; exact resume from the loader's position.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpt.data import write_shard  # noqa: E402

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=1,
            eval_interval=4, eval_iters=2, warmup_iters=2, lr_decay_iters=12, learning_rate=3e-3, dropout=0.1,
            compile=False, device="cpu", dtype="float32", log_interval=1, dataset="tinyshards")

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


def train(shards, out_dir, **kw):
    args = [f"--{k}={v}" for k, v in {**TINY, **kw}.items()]
    r = subprocess.run([sys.executable, "train.py", f"--data_dir={shards}", f"--out_dir={out_dir}", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "HELLASWAG_DIR": str(shards)})  # its hellaswag_val.jsonl
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def rows(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [row for row in map(json.loads, f) if row["kind"] == kind]


def test_samples_and_hellaswag_during_training_leave_the_losses_alone(shards, tmp_path):
    plain, extras = tmp_path / "plain", tmp_path / "extras"
    train(shards, plain, max_iters=8)
    r = train(shards, extras, max_iters=8, sample_interval=4, num_samples_train=2, sample_max_tokens=8,
              hellaswag_interval=4)
    # the same losses, bitwise, with sampling and HellaSwag on: they draw on no training random stream
    assert [(x["loss"], x["grad_norm"]) for x in rows(plain, "train")] == \
           [(x["loss"], x["grad_norm"]) for x in rows(extras, "train")]
    samples = rows(extras, "sample")
    assert [s["step"] for s in samples] == [4, 8]  # none at step 0: untrained weights
    assert all(len(s["samples"]) == 2 and all(t.startswith("Hello, I'm a language model,") for t in s["samples"])
               for s in samples)
    assert 'sample 4: "Hello, I\'m a language model,' in r.stdout  # repr: one line per sample
    evals = rows(extras, "eval")
    assert [e["step"] for e in evals] == [0, 4, 8]
    for e in evals:
        assert 0 <= e["hellaswag"] <= 1 and 0 <= e["hellaswag_acc"] <= 1
        assert e["perplexity"] == pytest.approx(np.exp(e["val_loss"]))
    assert "hellaswag" in r.stdout.split("step 8:")[1].splitlines()[0]


def test_sharded_training_resumes_at_the_next_unseen_window(shards, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(shards, whole, max_iters=12)
    train(shards, halves, max_iters=6)
    train(shards, halves, max_iters=12, init_from="resume")
    a, b = rows(whole, "train"), rows(halves, "train")
    assert [x["step"] for x in b] == list(range(12))
    assert [x["loss"] for x in a] == [x["loss"] for x in b]
    import torch
    ca = torch.load(whole / "ckpt.pt", weights_only=True)
    cb = torch.load(halves / "ckpt.pt", weights_only=True)
    assert ca["train_loader"] == cb["train_loader"]
    # 12 steps of 4 x 32 tokens from the first train shard, in order: the 13th window (fetched, not yet
    # trained on) starts at 12 x 128
    assert ca["train_loader"] == {"shard": 0, "offset": 12 * 128, "epoch": 0}
    for k in ca["model"]:
        assert torch.equal(ca["model"][k], cb["model"][k]), k


def test_checkpoint_interval(shards, tmp_path):
    out = tmp_path / "out"
    r = train(shards, out, max_iters=10, checkpoint_interval=4, always_save_checkpoint=False, keep_checkpoints=5)
    # every 4 steps and at the end, whatever the validation loss did
    assert sorted(f for f in os.listdir(out) if f.startswith("ckpt-")) == \
           ["ckpt-0000004.pt", "ckpt-0000008.pt", "ckpt-0000010.pt"]
    assert r.stdout.count("saving checkpoint") == 3
