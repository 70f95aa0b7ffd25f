"""
Scaling out on the CPU with gloo: DDP over two processes computes what one process does with twice the
accumulation; FSDP2 computes what DDP does, resumes exactly, and its sharded checkpoint converts to a
ckpt.pt; a rank that dies brings the run down instead of hanging it.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpt.checkpoint import load_checkpoint  # noqa: E402
from gpt.data import write_shard  # noqa: E402

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# float32 and no dropout: the runs must agree to rounding
# 4 micro-steps: 2 per rank, so gradient accumulation without a reduction in between is exercised too
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=4,
            eval_interval=4, eval_iters=2, warmup_iters=2, lr_decay_iters=8, learning_rate=3e-3, dropout=0.0,
            compile=False, device="cpu", dtype="float32", log_interval=1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    ids = (np.arange(40000) * 7 + (rng.random(40000) < 0.1) * rng.integers(0, 16, 40000)) % 16
    write_shard(d / "t_val_000000.bin", ids[:8000])
    write_shard(d / "t_train_000001.bin", ids[8000:])
    (d / "meta.json").write_text(json.dumps({"tokenizer": "char", "vocab_size": 16, "itos": list("abcdefghijklmn \n")}))
    return d


def train(shards, out_dir, nproc=1, script="train.py", check=True, **kw):
    args = [f"--{k}={v}" for k, v in {**TINY, **kw}.items()]
    cmd = (TORCHRUN if nproc == 2 else [sys.executable]) + [script, f"--data_dir={shards}", f"--out_dir={out_dir}", *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [row["loss"] for row in map(json.loads, f) if row["kind"] == "train"]


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    out = {name: tmp / name for name in ("one", "ddp", "fsdp", "fsdp_halves")}
    train(shards, out["one"], max_iters=8)
    train(shards, out["ddp"], nproc=2, max_iters=8)
    train(shards, out["fsdp"], nproc=2, max_iters=8, parallelism="fsdp")
    train(shards, out["fsdp_halves"], nproc=2, max_iters=4, parallelism="fsdp")
    r = train(shards, out["fsdp_halves"], nproc=2, max_iters=8, parallelism="fsdp", init_from="resume")
    out["resume_log"] = r.stdout
    return out


def test_two_processes_compute_what_one_does_with_twice_the_accumulation(runs):
    # the sequential loader hands rank 1 the window that micro-step 2 of a single process would read
    one, ddp = losses(runs["one"]), losses(runs["ddp"])
    assert len(one) == len(ddp) == 8
    np.testing.assert_allclose(ddp, one, rtol=0, atol=1e-5)
    a = torch.load(runs["one"] / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(runs["ddp"] / "ckpt.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)


def test_fsdp_computes_what_ddp_does(runs):
    np.testing.assert_allclose(losses(runs["fsdp"]), losses(runs["ddp"]), rtol=0, atol=1e-5)
    files = sorted(os.listdir(runs["fsdp"] / "ckpt_dcp"))
    assert "train_state.pt" in files and len([f for f in files if f.endswith(".distcp")]) == 2  # a part per rank


def test_fsdp_resumes_exactly(runs):
    assert "Resuming training from" in runs["resume_log"] and "ckpt_dcp" in runs["resume_log"]
    assert losses(runs["fsdp_halves"]) == losses(runs["fsdp"])  # bitwise


def test_sharded_checkpoint_converts_for_sampling(runs, shards):
    out = runs["fsdp"]
    r = subprocess.run([sys.executable, "convert_checkpoint.py", f"--out_dir={out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    ddp = torch.load(runs["ddp"] / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 8 and ckpt["model_args"] == ddp["model_args"]
    for k in ddp["model"]:
        torch.testing.assert_close(ckpt["model"][k], ddp["model"][k], rtol=0, atol=1e-5)
    r = subprocess.run([sys.executable, "sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1",
                        "--max_new_tokens=20"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and set(r.stdout.split("tokenizer: char (16 tokens)\n")[1].split("---")[0]) <= set("abcdefghijklmn \n")


def test_fsdp_needs_several_processes_and_ddp_resume_names_the_fix(runs, shards, tmp_path):
    r = train(shards, tmp_path / "x", check=False, max_iters=2, parallelism="fsdp")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: parallelism=fsdp needs several")
    r = train(shards, runs["fsdp_halves"], check=False, max_iters=10, init_from="resume")
    assert r.returncode == 2 and "--parallelism=fsdp" in r.stderr.strip().splitlines()[-1]


DYING_RANK = '''
import os, runpy, sys
sys.path.insert(0, {root!r})
import model
calls, forward = [0], model.GPT.forward
def dies(self, *a, **k):
    calls[0] += 1
    if os.environ["RANK"] == "1" and calls[0] == 6:
        os._exit(3)  # as if the GPU or the node went away
    return forward(self, *a, **k)
model.GPT.forward = dies
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path({root!r} + "/train.py", run_name="__main__")
'''


def test_a_dying_rank_ends_the_whole_run(shards, tmp_path):
    wrapper = tmp_path / "dying.py"
    wrapper.write_text(DYING_RANK.format(root=ROOT))
    t0 = time.time()
    r = train(shards, tmp_path / "out", nproc=2, script=str(wrapper), check=False, max_iters=1000,
              eval_interval=1000, dist_timeout_minutes=1)
    assert r.returncode != 0
    assert time.time() - t0 < 120  # torchrun stops the surviving rank; nothing waits for a collective forever
