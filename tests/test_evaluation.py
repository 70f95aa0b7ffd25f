"""
train.py on a sharded GPT-2-BPE dataset with the build-nanogpt extras on: sequential shard loading,
HellaSwag and samples during training, the training log; exact resume from the loader's position.
"""
import json
import os

import numpy as np
import pytest
import torch
from conftest import counting_ids, flags, log_rows, run, tiny, write_ids_dataset

from gpt.data.sources import write_shard

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
