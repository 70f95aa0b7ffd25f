"""
Scaling out on the CPU with gloo, two processes launched by torchrun as on a GPU node: DDP over two
processes computes what one process does with twice the accumulation, ranks end with identical parameters
and only rank 0 writes; FSDP2 computes what DDP does, resumes exactly, and its sharded checkpoint converts to a
ckpt.pt; a rank that dies brings the run down instead of hanging it.
"""
import os
import pickle
import re
import shutil
import subprocess
import time
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import (
    FORKED_TORCHRUN,
    ROOT,
    assert_same_training,
    counting_ids,
    flags,
    log_rows,
    run,
    tiny,
    write_ids_dataset,
)

from gpt.checkpoint import load_checkpoint
from model import GPT, GPTConfig

# float32 and no dropout: the runs must agree to rounding
# 4 micro-steps: 2 per rank, so gradient accumulation without a reduction in between is exercised too
TINY = tiny(gradient_accumulation_steps=4, lr_decay_iters=8)
TERMS = TINY["batch_size"] * TINY["block_size"] * TINY["gradient_accumulation_steps"]  # summed per gradient


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    ids = counting_ids(40000, stride=7)
    return write_ids_dataset(tmp_path_factory.mktemp("shards"), ids, "abcdefghijklmn \n", val=0.2, shards=True)


def train(shards, out_dir, nproc=1, script="train.py", check=True, **kw):
    return run(script, f"--data_dir={shards}", f"--out_dir={out_dir}", *flags(**{**TINY, **kw}), nproc=nproc,
               check=check)


def losses(out_dir):
    return [row["loss"] for row in log_rows(out_dir)]


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    out = {name: tmp / name for name in ("one", "ddp", "fsdp", "fsdp_keep", "fsdp_halves")}
    train(shards, out["one"], max_iters=8)
    train(shards, out["ddp"], nproc=2, max_iters=8)
    train(shards, out["fsdp"], nproc=2, max_iters=8, parallelism="fsdp")
    train(shards, out["fsdp_keep"], nproc=2, max_iters=8, parallelism="fsdp", fsdp_reshard_after_forward=False)
    train(shards, out["fsdp_halves"], nproc=2, max_iters=4, parallelism="fsdp")
    r = train(shards, out["fsdp_halves"], nproc=2, max_iters=8, parallelism="fsdp", init_from="resume")
    out["resume_log"] = r.stdout
    return out


def test_two_processes_compute_what_one_does_with_twice_the_accumulation(runs):
    # the sequential loader hands rank 1 the window that micro-step 2 of a single process would read
    a = torch.load(runs["one"] / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(runs["ddp"] / "ckpt.pt", weights_only=True)["model"]
    assert len(log_rows(runs["one"])) == 8
    assert_same_training(log_rows(runs["ddp"]), log_rows(runs["one"]), TERMS, sum(v.numel() for v in a.values()))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)


def test_workers_forked_from_torchrun_train_what_its_own_processes_do_from_any_folder(runs, shards, tmp_path):
    # torchrun --run-path --start-method=fork (docs/scaling.md: no worker imports torch again) runs train.py in
    # torchrun's own interpreter, whose sys.path starts at the launch folder (or the torchrun command's folder)
    out = tmp_path / "forked"
    r = subprocess.run([*FORKED_TORCHRUN, os.path.join(ROOT, "train.py"), f"--data_dir={shards}", f"--out_dir={out}",
                        *flags(**{**TINY, "max_iters": 8})], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert losses(out) == losses(runs["ddp"])
    assert not (out / "run.lock").exists()  # removed at a clean end (atexit), as by a worker of its own


def test_fsdp_computes_what_ddp_does(runs):
    params = sum(v.numel() for v in torch.load(runs["ddp"] / "ckpt.pt", weights_only=True)["model"].values())
    assert_same_training(log_rows(runs["fsdp"]), log_rows(runs["ddp"]), TERMS, params)
    files = sorted(os.listdir(runs["fsdp"] / "ckpt_dcp"))
    assert "train_state.pt" in files and len([f for f in files if f.endswith(".distcp")]) == 2  # a part per rank


def test_fsdp_without_reshard_after_the_forward_computes_the_same(runs):
    assert losses(runs["fsdp_keep"]) == losses(runs["fsdp"])  # bitwise: the same sums, only memory differs


def test_fsdp_resumes_exactly(runs):
    assert "Resuming training from" in runs["resume_log"] and "ckpt_dcp" in runs["resume_log"]
    assert losses(runs["fsdp_halves"]) == losses(runs["fsdp"])  # bitwise


def test_sharded_checkpoint_converts_for_sampling(runs, shards):
    out = runs["fsdp"]
    run("convert_checkpoint.py", f"--out_dir={out}")
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    ddp = torch.load(runs["ddp"] / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 8 and ckpt["model_args"] == ddp["model_args"]
    # exactly the weights FSDP trained: the shards read back another way, by DCP's own resharding load into
    # the full model's state_dict, in this one process. (Not DDP's weights: those differ from FSDP's by
    # rounding, which AdamW lets grow - test_fsdp_computes_what_ddp_does bounds that through the losses.)
    expected = {"model": GPT(GPTConfig(**ckpt["model_args"])).state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process, as intended
        dcp.load(expected, checkpoint_id=str(out / "ckpt_dcp"))
    assert ckpt["model"].keys() == expected["model"].keys()
    for k, v in expected["model"].items():
        assert torch.equal(ckpt["model"][k], v), k
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=20")
    assert set(r.stdout.split("tokenizer: char (16 tokens)\n")[1].split("---")[0]) <= set("abcdefghijklmn \n")


def test_fsdp_needs_several_processes_and_ddp_resume_names_the_fix(runs, shards, tmp_path):
    r = train(shards, tmp_path / "x", check=False, max_iters=2, parallelism="fsdp")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: parallelism=fsdp needs several")
    r = train(shards, runs["fsdp_halves"], check=False, max_iters=10, init_from="resume")
    assert r.returncode == 2 and "--parallelism=fsdp" in r.stderr.strip().splitlines()[-1]



class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_an_fsdp_resume_refuses_a_metadata_that_would_run_code(runs, shards, tmp_path):
    """A real fsdp save's .metadata passes the restricted reader; with one entry more whose class calls
    os.system (which DCP's own unpickler would run), the resume stops in one line on each rank, before DCP."""
    from gpt.checkpoint import sharded
    out, marker = tmp_path / "out", tmp_path / "pwned"
    shutil.copytree(runs["fsdp"], out, ignore=shutil.ignore_patterns("ckpt.pt"))  # converted by a test above
    metadata = sharded.read_metadata(str(out / "ckpt_dcp"))
    metadata.planner_data = {"x": _Exploit(marker)}
    with open(out / "ckpt_dcp" / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    r = train(shards, out, nproc=2, check=False, max_iters=10, parallelism="fsdp", init_from="resume")
    assert r.returncode != 0 and not marker.exists()
    lines = {re.sub(r"^\[rank\d\]: ", "", line) for line in (r.stdout + r.stderr).splitlines()
             if "is unsafe" in line and not line.startswith(" ")}  # torchrun's summary repeats it, indented
    assert lines == {f"error: {out / 'ckpt_dcp' / '.metadata'} is unsafe, not loaded: it names posix.system, which "
                     f"no sharded checkpoint holds, and loading it could run code; use a checkpoint from a source "
                     f"you trust"}, (r.stdout + r.stderr)[-3000:]

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


@pytest.mark.parametrize("ddp_sync", ["wrapper", "hooks"])  # hooks: the survivor waits in GradSync's all-reduce
def test_a_dying_rank_ends_the_whole_run(shards, tmp_path, ddp_sync):
    wrapper = tmp_path / "dying.py"
    wrapper.write_text(DYING_RANK.format(root=ROOT))
    t0 = time.time()
    r = train(shards, tmp_path / "out", nproc=2, script=str(wrapper), check=False, max_iters=1000,
              eval_interval=1000, dist_timeout_minutes=1, ddp_sync=ddp_sync)
    assert r.returncode != 0
    assert time.time() - t0 < 120  # torchrun stops the surviving rank; nothing waits for a collective forever


# DistributedDataParallel, each rank dumping what it ended with
DDP_TINY = tiny(gradient_accumulation_steps=2, max_iters=10, eval_interval=5, lr_decay_iters=10,
                learning_rate=1e-3, dataset="tiny")
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


def torchrun(script, *args):
    return run(script, *args, nproc=2, check=False)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # a learnable sequence: mostly counting up through the alphabet, with some noise
    return write_ids_dataset(tmp_path_factory.mktemp("tiny_data"), counting_ids(20000), "abcdefghijklmnop")


def dump_run(tmp, data_dir, out_dir, **kw):
    """torchrun the rank-dumping wrapper; returns (completed process, {rank: dump})."""
    dump_dir = tmp / f"dumps-{out_dir.name}"
    dump_dir.mkdir()
    helper = tmp / "rank_dump.py"
    helper.write_text(RANK_DUMP)
    r = torchrun(str(helper), ROOT, dump_dir, f"--data_dir={data_dir}", f"--out_dir={out_dir}",
                 *flags(**{**DDP_TINY, **kw}))
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
    assert dumps[0]["iter_num"] == dumps[1]["iter_num"] == DDP_TINY["max_iters"]
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


# the speedrun recipe's switches (config/speedrun_gcide.py) on a tiny model, float32
RECIPE = dict(optimizer='muon', muon_lr=0.02, learning_rate=6e-3, qk_norm=True, zero_init_proj=True,
              tie_embeddings=False, bias=False, lr_schedule="wsd", lr_decay_frac=0.4, min_lr=0.0, grad_clip=0.0,
              weight_decay=0.0, max_iters=6, lr_decay_iters=6, eval_interval=6, ddp_sync="hooks")


def test_two_ranks_train_what_one_process_does_on_random_windows(data_dir, tmp_path):
    # the speedrun on two GPUs once ended worse than on one at the same global batch. With the same
    # micro-batches (train.bin's random windows are numbered over all ranks, gpt/data/loader.py), one process
    # with 2 accumulation steps and two ranks with 1 each compute the same thing: DDP divides each rank's
    # gradient by 2 and sums, which in float32 is the single process's g1/2 + g2/2 (one addition, which
    # commutes), so Muon gets the same momentum and the weights come out equal; the logged losses are summed
    # in another order (1e-7). Before the fix the ranks drew other windows: 4e-3 apart at the first step.
    one, two = tmp_path / "one", tmp_path / "two"
    args = [f"--data_dir={data_dir}", *flags(**{**DDP_TINY, **RECIPE})]
    run("train.py", f"--out_dir={one}", *args)
    run("train.py", f"--out_dir={two}", *args, nproc=2)
    a, b = log_rows(one), log_rows(two)
    assert len(a) == len(b) == RECIPE["max_iters"]
    wa = torch.load(one / "ckpt.pt", weights_only=True)["model"]
    wb = torch.load(two / "ckpt.pt", weights_only=True)["model"]
    # within rounding (bitwise here on torch 2.13's CPU; other builds may sum in other orders)
    assert_same_training(b, a, DDP_TINY["batch_size"] * DDP_TINY["block_size"] * 2, sum(v.numel() for v in wa.values()))
    for k in wa:  # one Muon step moves a weight by ~muon_lr / sqrt(fan): 1e-4 is far below one step's difference
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-4)


def test_only_rank_zero_writes(ddp_run):
    _, out_dir, r, _ = ddp_run
    assert sorted(os.listdir(out_dir)) == ["ckpt.pt", "log.jsonl"]
    assert [row["step"] for row in log_rows(out_dir, "eval")] == [0, 5, 10]
    assert [row["step"] for row in log_rows(out_dir)] == list(range(10))
    # and only rank 0 prints
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


def test_a_global_batch_the_ranks_cannot_share_is_one_line(data_dir, tmp_path):
    # 3 micro-steps of 3 sequences: 9 sequences a step, which 2 ranks cannot share equally
    r = torchrun("train.py", f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'out'}",
                 *flags(**{**DDP_TINY, "gradient_accumulation_steps": 3, "batch_size": 3}))
    assert r.returncode != 0
    assert not os.path.exists(tmp_path / "out" / "ckpt.pt")
    out = r.stdout + r.stderr
    # the message must get out although dist.init_process_group wraps sys.excepthook and buffers stderr
    # (torchrun's failure summary repeats it, indented, as the failed workers' "traceback": not counted)
    lines = {re.sub(r"^\[rank\d\]: ", "", line) for line in out.splitlines()
             if "shared equally" in line and not line.startswith(" ")}
    assert len(lines) == 1, out[-3000:]
    line = lines.pop()
    assert line.startswith("error: the global batch of 9 sequences (gradient_accumulation_steps=3 x batch_size=3) "
                           "cannot be shared equally by 2 processes: start 1, 3, 9 of them") \
        and "--total_batch_size=256 or 320 " in line, line
    assert 'File "' + os.path.join(ROOT, "train.py") not in out  # no traceback from train.py itself


def test_one_micro_step_is_shared_by_two_ranks_as_the_same_training(data_dir, tmp_path):
    """nanoGPT's gradient_accumulation_steps=1 (shakespeare_char's) on two ranks: each takes half of the
    micro-batch, the same windows as one process (gpt/data/loader.py), so the same training to rounding."""
    one, two = tmp_path / "one", tmp_path / "two"
    args = [f"--data_dir={data_dir}", *flags(**{**DDP_TINY, "gradient_accumulation_steps": 1, "max_iters": 4,
                                                "eval_interval": 4, "lr_decay_iters": 4})]
    run("train.py", f"--out_dir={one}", *args)
    r = run("train.py", f"--out_dir={two}", *args, nproc=2)
    assert "gradient_accumulation_steps=1 x batch_size=4 -> gradient_accumulation_steps=2 (1 per process) of 2 " \
           "sequences" in r.stdout, r.stdout[-2000:]
    assert torch.load(two / "ckpt.pt", weights_only=True)["config"]["batch_size"] == 2  # the split in effect
    wa = torch.load(one / "ckpt.pt", weights_only=True)["model"]
    assert_same_training(log_rows(two), log_rows(one), DDP_TINY["batch_size"] * DDP_TINY["block_size"],
                         sum(v.numel() for v in wa.values()))


@pytest.mark.parametrize("dataset, parallelism, accumulation", [("windows", "ddp", 2), ("shards", "fsdp", 2),
                                                                 ("windows", "ddp", 1)])
def test_two_ranks_evaluate_what_one_process_does(data_dir, shards, tmp_path, dataset, parallelism, accumulation):
    """The same weights (step 0's), the same losses on 1 and 2 processes: each rank evaluates its share of one
    process's batches (gpt/training/evaluation.py), at one process's batch size also where training splits its
    micro-batch over the ranks (gradient_accumulation_steps=1); eval_iters=3 does not divide by 2 (rank 1 runs
    one uncounted batch more, so that FSDP's ranks run as many forwards). Before, each rank evaluated eval_iters
    batches of its own: 2 ranks averaged other (and twice as many) batches."""
    args = [f"--data_dir={data_dir if dataset == 'windows' else shards}",
            *flags(**{**DDP_TINY, "gradient_accumulation_steps": accumulation, "max_iters": 0, "eval_iters": 3})]
    one, two = tmp_path / "one", tmp_path / "two"
    run("train.py", f"--out_dir={one}", *args)
    run("train.py", f"--out_dir={two}", *args, f"--parallelism={parallelism}", nproc=2)
    (a,), (b,) = log_rows(one, "eval"), log_rows(two, "eval")
    for split in ("train_loss", "val_loss"):
        assert abs(a[split] - b[split]) <= 1e-6, (split, a[split], b[split])
