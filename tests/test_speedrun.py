"""
The speedrun comparison's pieces on the CPU: gpt/training/evaluation.py's whole-split loss against a direct
computation, dev/speedrun.py's timestamped runner, log parsing, table and plot, and the recipe
(config/speedrun_gcide.py) training a tiny model through train.py with its checkpoint scored.
"""
import json
import os
import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from test_checkpoint import data_dir, train  # noqa: F401 (data_dir is a fixture)

from model import GPT, GPTConfig

sys.path.insert(0, os.path.join(ROOT, "dev"))
import speedrun  # noqa: E402
from speedrun import full_split_loss  # noqa: E402


@pytest.mark.parametrize("n", [32 * 7 + 1, 32 * 7 + 10])  # windows that fill the file exactly, or a short last one
def test_full_split_loss_is_every_token_once(tmp_path, n):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=50, dropout=0.0))
    ids = np.random.default_rng(0).integers(0, 50, n).astype(np.uint16)
    path = tmp_path / "val.bin"
    ids.tofile(path)
    got = full_split_loss(model, str(path), 32, 3, "cpu", nullcontext())
    # directly: each window alone, the per-token losses of all of them, averaged
    t = torch.from_numpy(ids.astype(np.int64))
    losses = []
    with torch.no_grad():
        for s in range(0, n - 1, 32):
            x, y = t[s:min(s + 32, n - 1)], t[s + 1:min(s + 33, n)]
            logits, _ = model(x[None], y[None])
            losses.append(F.cross_entropy(logits[0], y, reduction="none"))
    per_token = torch.cat(losses)
    assert per_token.numel() == n - 1
    assert got == pytest.approx(per_token.double().mean().item(), rel=1e-6)
    assert model.training  # left as it was found


def test_runner_timestamps_lines_and_parses_both_trainers(tmp_path):
    script = ("import time; print('step 0: train loss 10.9, val loss 10.95', flush=True); time.sleep(0.3); "
              "print('step 50: train loss 6.1, val loss 6.2000, perplexity 492.7, 12.5s since launch')")
    lines = speedrun.run_timestamped([sys.executable, "-c", script], str(tmp_path), tmp_path / "log.jsonl")
    evals = speedrun.parse_evals(lines)
    assert [(e["step"], e["val"], e["since_launch"]) for e in evals] == [(0, 10.95, None), (50, 6.2, 12.5)]
    assert evals[1]["t"] - evals[0]["t"] >= 0.25
    assert (tmp_path / "log.jsonl").read_text().count("\n") == 2
    with pytest.raises(SystemExit, match="failed"):
        speedrun.run_timestamped([sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path), tmp_path / "x.jsonl")


def test_breakdown_says_where_a_runs_time_went():
    lines = [(0.1, "config: ..."), (2.0, "startup: first step at 2.0s since launch (import torch 1.0s)"),
             (2.1, "iter 0: loss 4.2, lr 1e-05, norm 1.0, time 900.00ms, tok/s 18,204"),
             *[(2.1 + i / 100, f"iter {i}: loss 3.0, norm 0.5, time {7 + i % 3}.00ms") for i in range(10, 60, 10)],
             (2.9, "step 60: train loss 2.0, val loss 2.1000, perplexity 8.2, 2.9s since launch"),
             (2.95, "saving checkpoint to out/ckpt.pt"), (3.2, "iter 60: loss 2.0, time 8.00ms"),
             (3.3, "iter 70: loss 2.0, time 11.00ms")]
    parts = speedrun.breakdown(lines)
    # steps after the 20th only (the first ones compile and capture): 7, 8, 9, 8, 11 ms at iters 30-70; the
    # save's 10 lines hold the steps logged at 60 and 70
    assert parts == dict(first_step=2.0, step_ms=8.0, evals=[0.3], saves=[0.3], after_save_ms=9.5)


@pytest.mark.needs("matplotlib")
def test_time_to_target_table_and_plot(tmp_path):
    evals = [dict(step=s, t=10.0 + s / 10, val=4 - s / 200) for s in (0, 100, 200, 260)]
    points = speedrun.curve(evals, [(200, 2000, 2.60), (100, 1000, 2.9), (260, 2600, 2.50)])
    assert points[0] == (20.0, 100, 1000, 2.9)
    hit = speedrun.first_at_or_below(points, 2.55)
    assert hit == (36.0, 260, 2600, 2.50)
    reference = (123.5, 400, 26214400, 2.547)
    env = dict(card="NVIDIA H100", torch="2.11", commit="abc123")
    table = speedrun.write_table(tmp_path / "t.md", env, 2.547, reference, {1337: points, 1: points[:1]})
    assert "| this project | 1337 | 2.5000 | 36.0 | 29% | 2,600 |" in table
    assert "| this project | 1 | 2.9000 | not reached |" in table and "NVIDIA H100" in table
    speedrun.plot(tmp_path / "p.png", evals, reference, 2.547, {1337: points}, points)
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_recipe_trains_and_its_checkpoint_is_scored(data_dir, tmp_path):  # noqa: F811
    """config/speedrun_gcide.py through train.py on the CPU, shrunk: every switch and Muon on, one checkpoint
    at the end, its eval line parsed and the checkpoint scored over the whole val.bin."""
    out = tmp_path / "run"
    r = train(data_dir, out, "config/speedrun_gcide.py", f"--out_dir={out}", "--device=cpu", "--dtype=float32",
              "--compile=False", "--n_layer=6", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=2",
              "--total_batch_size=128",
              "--max_iters=6", "--lr_decay_iters=6", "--eval_interval=6", "--checkpoint_interval=6", "--eval_iters=1",
              "--warmup_iters=1", "--log_interval=1")
    assert "muon:" in r.stdout
    evals = speedrun.parse_evals([(0.0, line) for line in r.stdout.splitlines()])
    assert [e["step"] for e in evals] == [0, 6] and all(e["since_launch"] is not None for e in evals)
    # the breakdown reads train.py's own lines: its startup line, every step's time, the last evaluation (the
    # first has no step before it) and the save
    parts = speedrun.breakdown([(float(i), line) for i, line in enumerate(r.stdout.splitlines())])
    assert parts["first_step"] is not None and len(parts["evals"]) == 1 and len(parts["saves"]) == 1
    assert sum(bool(speedrun.ITER_LINE.match(line)) for line in r.stdout.splitlines()) == 6
    step, tokens, loss = speedrun.score(str(out / "ckpt.pt"), str(data_dir / "val.bin"), "cpu", batch_size=4)
    assert step == 6 and tokens == 6 * 2 * 32 * 2 and 0 < loss < 10


def test_each_cold_run_gets_its_own_empty_compile_caches(tmp_path):
    # Triton's, inductor's and the CUDA driver's caches: a run that found kernels an earlier one compiled
    # would not be cold
    stale = tmp_path / "caches" / "seed1" / "triton"
    stale.mkdir(parents=True)
    (stale / "kernel.cubin").write_bytes(b"x")
    env = speedrun.fresh_caches(str(tmp_path), "seed1")
    assert set(env) == {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"}
    assert len(set(env.values())) == 3 and not (stale / "kernel.cubin").exists()
    assert all(v.startswith(str(tmp_path / "caches" / "seed1")) and not os.listdir(os.path.dirname(v)) for v in
               env.values())
    assert speedrun.fresh_caches(str(tmp_path), "seed2")["CUDA_CACHE_PATH"] != env["CUDA_CACHE_PATH"]


def faked_speedrun(tmp_path, monkeypatch, loss, seconds, fail_at=None):
    """dev/speedrun.py's main with its runs faked: each launch of this project's recipe is recorded as (command,
    environment) and leaves a checkpoint scored `loss` and a last evaluation at `seconds`; launch `fail_at` fails.
    Returns the launches and main's first arguments (nanoGPT's reference given, not run)."""
    cfg = tmp_path / "nano.py"
    cfg.write_text("dataset = 'gcide'\nmax_iters = 400\nbatch_size = 8\nblock_size = 1024\n"
                   "gradient_accumulation_steps = 8\n")
    launches = []

    def fake_run(cmd, cwd, log_path, env=None):
        launches.append((cmd, env))
        if len(launches) == fail_at:
            raise SystemExit("error: train.py failed")
        out_dir = next(c.split("=", 1)[1] for c in cmd if c.startswith("--out_dir="))
        os.makedirs(out_dir)
        open(os.path.join(out_dir, "ckpt.pt"), "w").close()
        return [(1.0, "step 0: train loss 10.9, val loss 10.95"), (seconds, "step 190: train loss 2.4, val loss 2.49")]

    monkeypatch.setattr(speedrun, "run_timestamped", fake_run)
    monkeypatch.setattr(speedrun, "corpus", lambda *a: None)
    monkeypatch.setattr(speedrun, "score", lambda ckpt, val, device, batch_size=16: (190, 3_112_960, loss))
    return launches, ["--anchor", str(tmp_path), "--nanogpt_config", str(cfg), "--curve=0",
                      f"--out={tmp_path / 'out'}", "--device=cpu"]


def test_a_call_cut_short_keeps_the_runs_it_scored(tmp_path, monkeypatch):
    # a GPU call's time limit or a crash in the second seed's run: the first seed's score is already in the
    # table and the JSON, not only in memory
    launches, args = faked_speedrun(tmp_path, monkeypatch, 2.4832, 19.5, fail_at=2)
    with pytest.raises(SystemExit, match="train.py failed"):
        speedrun.main([*args, "--reference=103.7,2.5271", "--seeds=1337,1"])
    assert len(launches) == 2
    table = (tmp_path / "out" / "speedrun.md").read_text()
    assert "| this project | 1337 | 2.4832 | 19.5 |" in table and "| 1 |" not in table, table
    assert list(json.loads((tmp_path / "out" / "speedrun.json").read_text())["runs"]) == ["1337"]


def test_forked_workers_are_launched_as_docs_speedrun_md_says(tmp_path, monkeypatch):
    # --fork=1: torchrun's own flags, and NVML to count the GPUs (else a forked worker cannot start CUDA)
    launches, args = faked_speedrun(tmp_path, monkeypatch, 2.4649, 14.5)
    args += ["--reference=103.9,2.5209", "--seeds=1337"]
    with pytest.raises(SystemExit, match="--fork=1 forks torchrun's workers: give --nproc=N"):
        speedrun.main([*args, "--fork=1"])
    speedrun.main([*args, "--fork=1", "--nproc=2"])
    (cmd, env), = launches
    assert cmd[1:8] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--run-path",
                        "--start-method=fork", "train.py"] and env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert "| this project | 1337 | 2.4649 | 14.5 |" in (tmp_path / "out" / "speedrun-2gpu-fork.md").read_text()
