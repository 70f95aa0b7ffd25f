"""
DistributedDataParallel on the CPU: two processes (gloo) launched by torchrun, as on a GPU node.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=2,
            max_iters=10, eval_interval=5, eval_iters=2, warmup_iters=2, lr_decay_iters=10, learning_rate=1e-3,
            dropout=0.0, compile=False, device="cpu", dtype="float32", dataset="tiny")
STEP_RE = re.compile(r"^(?:\[rank\d\]: )?step (\d+): train loss", re.M)

# Runs train.py inside each rank like torchrun would, then saves what that rank ended with. It imports
# nothing from the repository itself: train.py's globals (runpy returns them) hold the rank's model.
RANK_DUMP = '''
import os, runpy, sys
import torch
root, dump_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
script = os.path.join(root, "train.py")
sys.argv = [script] + sys.argv[3:]
g = runpy.run_path(script, run_name="__main__")
torch.save({"model": g["raw_model"].state_dict(), "iter_num": g["iter_num"],
            "next_batch": g["train_loader"].next_batch()[0]},
           os.path.join(dump_dir, f"rank{os.environ['RANK']}.pt"))
'''


def flags(**kw):
    return [f"--{k}={v}" for k, v in kw.items()]


def torchrun(script, *args, timeout=180):
    return subprocess.run([*TORCHRUN, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_data")
    rng = np.random.default_rng(0)
    itos = list("abcdefghijklmnop")
    # a learnable sequence: mostly counting up through the alphabet, with some noise
    ids = (np.arange(20000) + (rng.random(20000) < 0.1) * rng.integers(0, 16, 20000)) % 16
    ids.astype(np.uint16)[:18000].tofile(d / "train.bin")
    ids.astype(np.uint16)[18000:].tofile(d / "val.bin")
    (d / "meta.json").write_text('{"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": %s}'
                                 % str(itos).replace("'", '"'))
    return d


def dump_run(tmp, data_dir, out_dir, **kw):
    """torchrun the rank-dumping wrapper; returns (completed process, {rank: dump})."""
    dump_dir = tmp / f"dumps-{out_dir.name}"
    dump_dir.mkdir()
    helper = tmp / "rank_dump.py"
    helper.write_text(RANK_DUMP)
    r = torchrun(str(helper), ROOT, dump_dir, f"--data_dir={data_dir}", f"--out_dir={out_dir}",
                 *flags(**{**TINY, **kw}))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, {rank: torch.load(dump_dir / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("ddp")
    out_dir = tmp / "out"
    r, dumps = dump_run(tmp, data_dir, out_dir)
    return tmp, out_dir, r, dumps


def test_ranks_end_with_identical_parameters(ddp_run):
    _, out_dir, r, dumps = ddp_run
    assert "Traceback" not in r.stderr
    assert dumps[0]["iter_num"] == dumps[1]["iter_num"] == TINY["max_iters"]
    # the ranks trained on different batches (different data streams)...
    assert not torch.equal(dumps[0]["next_batch"], dumps[1]["next_batch"])
    # ...yet gradients were averaged, so every parameter is the same on both
    m0, m1 = dumps[0]["model"], dumps[1]["model"]
    assert m0.keys() == m1.keys()
    for k in m0:
        assert torch.equal(m0[k], m1[k]), k
    # and the checkpoint holds exactly those weights, without DDP's module. prefix
    ckpt = torch.load(out_dir / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["model"].keys() == m0.keys()
    for k in m0:
        assert torch.equal(ckpt["model"][k], m0[k]), k
    # the micro-steps were split over the ranks: 2 accumulation steps in all, 1 per rank
    assert ckpt["config"]["gradient_accumulation_steps"] == 2
    assert "tokens per iteration will be: 256" in r.stdout  # 2 ranks x 1 micro-step x 4 x 32


def test_only_rank_zero_writes(ddp_run):
    _, out_dir, r, _ = ddp_run
    assert sorted(os.listdir(out_dir)) == ["ckpt.pt", "log.jsonl"]
    out = r.stdout + r.stderr
    assert [int(n) for n in STEP_RE.findall(out)] == [0, 5, 10], out[-3000:]
    assert out.count("saving checkpoint") == 2  # at steps 5 and 10, by one rank
    assert len(re.findall(r"^(?:\[rank\d\]: )?iter 9: loss", out, re.M)) == 1


def test_resumed_ranks_draw_different_batches(ddp_run, data_dir):
    tmp, out_dir, _, _ = ddp_run
    resumed = tmp / "resumed"
    shutil.copytree(out_dir, resumed)
    r, dumps = dump_run(tmp, data_dir, resumed, init_from="resume", max_iters=14)
    assert dumps[0]["iter_num"] == 14
    for k in dumps[0]["model"]:
        assert torch.equal(dumps[0]["model"][k], dumps[1]["model"][k]), k
    # every rank must keep its own data stream after a resume, or each step averages copies of one batch
    assert not torch.equal(dumps[0]["next_batch"], dumps[1]["next_batch"]), \
        "after resume both ranks draw the same batches"


def test_gradient_accumulation_not_divisible_by_ranks(data_dir, tmp_path):
    r = torchrun("train.py", f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'out'}",
                 *flags(**{**TINY, "gradient_accumulation_steps": 3}))
    assert r.returncode != 0
    assert not os.path.exists(tmp_path / "out" / "ckpt.pt")
    out = r.stdout + r.stderr
    # the message must get out although dist.init_process_group wraps sys.excepthook and buffers stderr
    lines = {re.sub(r"^\[rank\d\]: ", "", line) for line in out.splitlines() if "divisible" in line}
    assert len(lines) == 1, out[-3000:]
    line = lines.pop()
    assert line.startswith("error:") and "gradient_accumulation_steps=3" in line
    assert 'File "' + os.path.join(ROOT, "train.py") not in out  # no traceback from train.py itself
