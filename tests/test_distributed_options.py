"""
The DDP and FSDP2 options of gpt/distributed.wrap on the CPU, two processes with gloo, float32: bucket size,
gradients as bucket views and static_graph change no loss; bfloat16 gradient reduction changes them a
little; a wrong value is one line.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, flags, run

from gpt.data.sources import write_shard
from model import GPT, GPTConfig

# 4 micro-steps, 2 per rank: a micro-step without gradient sync, then one with it
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=4,
            eval_interval=100, eval_iters=1, warmup_iters=2, lr_decay_iters=6, learning_rate=3e-3, dropout=0.0,
            compile=False, device="cpu", dtype="float32", log_interval=1, max_iters=6, checkpoint_interval=-1)


def train(data, out_dir, nproc=2, check=False, **kw):
    return run("train.py", f"--data_dir={data}", f"--out_dir={out_dir}", *flags(**{**TINY, **kw}), nproc=nproc,
               check=check, timeout=240)


def train_rows(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [row for row in map(json.loads, f) if row["kind"] == "train"]


def losses(out_dir):
    return [row["loss"] for row in train_rows(out_dir)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_options")
    data = tmp / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    ids = (np.arange(40000) * 7 + (rng.random(40000) < 0.1) * rng.integers(0, 16, 40000)) % 16
    write_shard(data / "t_val_000000.bin", ids[:8000])
    write_shard(data / "t_train_000001.bin", ids[8000:])
    (data / "meta.json").write_text(json.dumps({"tokenizer": "char", "vocab_size": 16,
                                                "itos": list("abcdefghijklmn \n")}))
    settings = {
        "ddp": {},  # ours: buckets of 100 MB, gradients as views into them, static_graph
        # every one of those the other way: buckets of ~4 KB (several all-reduces a step instead of one),
        # gradients of their own, no static_graph (FSDP2's options: tests/test_distributed.py)
        "ddp_small": dict(ddp_bucket_mb=0.004, ddp_bucket_view=False, ddp_static_graph=False),
        "ddp_bf16": dict(ddp_reduce_dtype="bfloat16"),
        "ddp_hooks": dict(ddp_sync="hooks"),  # no wrapper: gpt/runtime/distributed.py's GradSync
    }
    out = {}
    for name, kw in settings.items():
        train(data, tmp / name, check=True, **kw)
        out[name] = losses(tmp / name)
        out[name + "_rows"] = train_rows(tmp / name)
        assert len(out[name]) == TINY["max_iters"], name
    out["data"], out["tmp"] = data, tmp
    return out


def test_bucket_size_views_and_static_graph_change_no_loss(runs):
    # each gradient element is the same sum of two ranks; static_graph's first micro-step reduces too (DDP needs
    # it), so the first step's sum is rounded differently: equal to float32 rounding, where a bucket missed or
    # reduced twice would be off by the size of a gradient
    np.testing.assert_allclose(runs["ddp_small"], runs["ddp"], rtol=0, atol=1e-6)
    assert runs["ddp_small"][0] == runs["ddp"][0]  # the first loss comes before any update


def test_hooks_train_as_the_wrapper_does(runs):
    # without the static graph's extra first reduction, the wrapper's sums in the same order: bit for bit
    # (tests/test_gradsync.py compares them step by step, weights too)
    assert runs["ddp_hooks"] == runs["ddp_small"]
    norms = {name: [row["grad_norm"] for row in runs[name + "_rows"]] for name in ("ddp_hooks", "ddp_small")}
    assert norms["ddp_hooks"] == norms["ddp_small"]


def test_static_graph_is_decided_from_the_model():
    """static_graph is right only where every step uses the same parameters: a parameter no training step
    reaches turns it off. The check draws no random numbers (dropout is on in training) and leaves .grad."""
    import torch

    from gpt.runtime import distributed
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=16, dropout=0.1))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    rng = torch.get_rng_state()
    assert distributed.static_graph_problem(model) is None
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(bool((p.grad == 1).all()) for p in model.parameters())
    model.unused = torch.nn.Linear(4, 4)  # an experiment's head, say, that the forward pass never calls
    assert distributed.static_graph_problem(model).startswith(
        "2 parameters get no gradient from a training step (unused.weight, unused.bias)")


def test_bf16_reduction_is_close_but_not_exact(runs):
    # gradients rounded to bf16 (8 bits of mantissa) before the sum: the losses drift apart a little
    np.testing.assert_allclose(runs["ddp_bf16"], runs["ddp"], rtol=0, atol=2e-2)
    assert runs["ddp_bf16"][0] == runs["ddp"][0]  # the first loss comes before any update
    assert runs["ddp_bf16"] != runs["ddp"]


def test_wrong_values_are_one_error_line(runs):
    for kw, words in ((dict(ddp_reduce_dtype="float16"), "ddp_reduce_dtype 'float16'"),
                      (dict(ddp_bucket_mb=0), "ddp_bucket_mb must be positive"),
                      (dict(ddp_sync="hook"), "ddp_sync='hook' makes no sense: ddp_sync must be 'wrapper' or 'hooks'")):
        r = train(runs["data"], runs["tmp"] / "bad", nproc=1, **kw)
        assert r.returncode == 2, r.stderr[-2000:]
        lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and words in lines[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr


def test_regional_compilation_compiles_one_block_for_all_and_matches_eager(one_thread):
    # compile_scope='blocks': each block compiled in place; dynamo traces one block and the others
    # reuse its code (one graph for three blocks), and the loss and gradients are eager's (float32, CPU inductor)
    import copy

    import torch
    from torch._dynamo.utils import counters

    from gpt.runtime import distributed
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    eager = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=40, dropout=0.0, bias=False,
                          qk_norm=True))
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    compiled = distributed.wrap(model, "ddp", "cpu", 0, "float32", compile=True, compile_scope="blocks")
    assert compiled is model and list(model.state_dict()) == list(eager.state_dict())  # names unchanged
    x, y = torch.randint(0, 40, (4, 16)), torch.randint(0, 40, (4, 16))
    _, want = eager(x, y)
    want.backward()
    try:
        _, got = compiled(x, y)
    except Exception as e:  # no C++ compiler for CPU inductor here: nothing to compare
        pytest.skip(f"torch.compile (inductor) cannot compile on this machine: {type(e).__name__}")
    got.backward()
    assert counters["stats"]["unique_graphs"] == 1 and counters["frames"]["ok"] == 1
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)


def test_unknown_compile_scope_is_one_line():
    import torch

    from gpt.runtime import distributed
    from gpt.runtime.errors import UserError
    with pytest.raises(UserError, match="unknown compile_scope 'layers': use model or blocks"):
        distributed.wrap(torch.nn.Linear(2, 2), "ddp", "cpu", 0, "float32", compile_scope="layers")


def test_unknown_compile_scope_stops_train_before_anything_is_written(tmp_path):
    r = train(tmp_path / "no-data", tmp_path / "out", nproc=1, compile_scope="layers")
    assert r.returncode == 2 and not (tmp_path / "out").exists()
    assert r.stderr.strip().splitlines()[-1].startswith("error: compile_scope='layers' makes no sense")


LAUNCH_ENV = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")


def test_a_launch_is_read_from_torchruns_variables_or_refused_in_one_line():
    from gpt.runtime.distributed import launch
    from gpt.runtime.errors import UserError
    assert launch({}, gpus=8) is None  # no RANK: one process
    assert launch(LAUNCH_ENV, gpus=2) == (1, 1, 2) and launch(LAUNCH_ENV, gpus=0) == (1, 1, 2)
    with pytest.raises(UserError, match="RANK is set, so this is a torchrun launch, but LOCAL_RANK, WORLD_SIZE, "
                                        "MASTER_ADDR, MASTER_PORT are not: launch with torchrun"):
        launch({"RANK": "0"}, gpus=1)  # a scheduler's own RANK, say, with python train.py
    with pytest.raises(UserError, match="LOCAL_RANK='x' is not a whole number"):
        launch({**LAUNCH_ENV, "LOCAL_RANK": "x"}, gpus=1)
    for bad in ({"RANK": "2"}, {"LOCAL_RANK": "-1"}, {"WORLD_SIZE": "0"}, {"LOCAL_RANK": "2"}):
        with pytest.raises(UserError, match="cannot be: ranks run from 0 to WORLD_SIZE-1"):
            launch({**LAUNCH_ENV, **bad}, gpus=8)
    with pytest.raises(UserError, match=r"process 1 of this machine has no GPU: the machine has 1, so start at "
                                        r"most 1 processes on it \(torchrun --nproc_per_node=1\)"):
        launch(LAUNCH_ENV, gpus=1)


def test_a_half_set_launch_is_one_line_from_train(tmp_path):
    """RANK set without the rest (or RANK=x): train.py says so, even from a process that is not rank 0."""
    for env in ({"RANK": "0"}, {"RANK": "3"}, {"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}):
        r = subprocess.run([sys.executable, "train.py", f"--out_dir={tmp_path / 'out'}", "--device=cpu"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1].startswith("error: RANK is set, so this is a torchrun launch"), env
    assert not (tmp_path / "out").exists()
