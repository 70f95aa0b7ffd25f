#!/usr/bin/env python3
"""
The GPU check: what CPU tests cannot see, run where users run it. Before a change to the training, model,
data or checkpoint path lands, run it on a GPU machine and quote its summary (docs/testing.md):

    python dev/gpu_check.py                 # every GPU of the machine (docs/testing.md has its time)
    python dev/gpu_check.py --parts=tests,gpt2     # some parts only (names as in the summary)

Each part is a command users type (or the tests marked cuda), run in a fresh process, timed, passed or failed
on what it printed and wrote; the summary is one table: card, torch, commit, then each part with its time and
the line that decided it. Logs of every part go to $OUT (or gpu-check-out/). On one GPU:

  tests        the CUDA-only tests (pytest -m cuda): CUDA-graph training steps and decoding, Muon captured;
               run beside the other parts from the start, reported last (its time: the wait at the end)
  gpt2         config/train_gpt2.py uncompiled, bf16, fused AdamW, a few steps of a smaller global batch
  gpt2-compile the same compiled (torch.compile of the model: a cold compile is most of this part's time)
  fused-loss   the same uncompiled with fused_loss=True: its losses within bf16 rounding of gpt2's
  speedrun     config/speedrun_gcide.py (Muon, QK-norm, ...) a few steps
  llama        config/train_llama_shakespeare_char.py a few steps
  graph        config/train_shakespeare_char.py (each step replayed from a CUDA graph) a few hundred steps:
               the loss must fall; its checkpoint is the next parts' model
  sample       sample.py on that checkpoint: the KV cache, CUDA-graphed decoding
  export       export.py on it, the folder reloaded by transformers: the same logits as the checkpoint's
and on a machine of several GPUs, for N = 2 and (where there are 4) 4:
  ddp-N, fsdp-N  config/train_shakespeare_char.py's model under torchrun --nproc_per_node=N, DDP and FSDP2:
               each step's loss within bf16 rounding (0.5%) of the one-GPU run's, on the same global batch
  ddp-hooks-N  the same with ddp_sync='hooks' and the step replayed from a CUDA graph
  forked-N     ddp-hooks-N with the workers forked from torchrun (--run-path --start-method=fork,
               PYTORCH_NVML_BASED_CUDA_CHECK=1); forked-unset-2: without that variable, the one error line
  ddp-hooks-dies-2  the same on 2 GPUs with rank 1 killed at its 20th step: torchrun must end the run
               (not 0, within 4 minutes), though the survivor waits in an all-reduce inside its graph

Data: data/synth (dev/synth_data.py makes it: random GPT-2 ids) for GPT-2's shape; data/gcide for the
speedrun where it exists (else synth); data/shakespeare_char (`python data/shakespeare_char/prepare.py`,
which needs a network or --input) for the char models: a part whose data is missing fails, naming it.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
OUT = os.environ.get("OUT") or os.path.join(ROOT, "gpu-check-out")
RUNS = os.path.join(ROOT, "out-gpu-check")  # the parts' out_dirs, replaced at each check
FEW = ["--eval_interval=1000", "--eval_iters=2", "--log_interval=1", "--wandb_log=False"]
# GPT-2 124M's shape at 4 micro-steps of 12 x 1024 a step (the config's 40 would take minutes uncompiled)
GPT2 = ["config/train_gpt2.py", "--dataset=synth", "--total_batch_size=49152", "--max_iters=6",
        "--checkpoint_interval=-1", *FEW]
CHAR = ["config/train_shakespeare_char.py", "--dropout=0.0", *FEW]


def sh(cmd, log, timeout=300, env=None):
    """Run cmd (a list) from the repository root; its output into log. Returns (exit status, output)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", **(env or {})}
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        out, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, code = f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {timeout}s", 124
    with open(os.path.join(OUT, log), "w") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n{out}")
    return code, out


def losses(out_dir):
    """The train losses of a run's log.jsonl, by step."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [row["loss"] for row in map(json.loads, f) if row["kind"] == "train"]


FORKED = ["--run-path", "--start-method=fork"]  # torchrun's workers forked from it (docs/scaling.md)
NVML = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # which a forked worker's CUDA needs


def train(name, args, nproc=1, forked=False, env=None):
    """train.py (under torchrun with nproc > 1) into out-gpu-check/name; returns (status, output, out_dir)."""
    out_dir = os.path.join(RUNS, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    launch = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
              *(FORKED if forked else [])] if nproc > 1 else [PY]
    code, out = sh([*launch, "train.py", *args, f"--out_dir={out_dir}"], f"{name}.log", env=env)
    return code, out, out_dir


def trained(name, args, nproc=1, expect=(), forked=False):
    """A training part: exit 0, every logged loss finite, and each regex of `expect` in its output."""
    code, out, out_dir = train(name, args, nproc, forked, NVML if forked else None)
    if code:
        raise Failed(f"exit {code}: {last_line(out)}")
    found = losses(out_dir)
    if not found or not all(math.isfinite(x) for x in found):
        raise Failed(f"losses {found}")
    for pattern in expect:
        if not re.search(pattern, out, re.M):
            raise Failed(f"no line matching {pattern!r}")
    startup = re.search(r"^startup: first step at ([0-9.]+)s", out, re.M)
    return found, out, (f"first step at {startup.group(1)}s, " if startup else "") + \
        f"loss {found[0]:.4f} -> {found[-1]:.4f} over {len(found)} steps"


class Failed(Exception):
    pass


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def need(path, how):
    if not os.path.exists(os.path.join(ROOT, path)):
        raise Failed(f"{path} is missing: {how}")


# the parts, in order: each returns the line the summary shows, or raises Failed
TESTS = [PY, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests"]
BESIDE = {}  # the tests' run, started first and beside the other parts (small models: the GPU has room)


def part_tests():
    code, out = BESIDE["tests"].result() if "tests" in BESIDE else sh(TESTS, "tests.log")
    summary = last_line(out)
    if code or "skipped" in summary or "passed" not in summary:  # a CUDA test that skips on a GPU is a failure
        raise Failed(summary)
    return summary


def part_gpt2():
    need("data/synth", "python dev/synth_data.py")
    found, out, line = trained("gpt2", [*GPT2, "--compile=False"], expect=[r"using fused AdamW: True"])
    part_gpt2.losses = found
    return line


def part_gpt2_compile():
    need("data/synth", "python dev/synth_data.py")
    return trained("gpt2-compile", [*GPT2, "--compile=True"], expect=[r"compiling the model"])[2]


def part_fused_loss():
    need("data/synth", "python dev/synth_data.py")
    found, _, line = trained("fused-loss", [*GPT2, "--compile=False", "--fused_loss=True"])
    plain = getattr(part_gpt2, "losses", None)
    if plain:
        worst = max(abs(a - b) / b for a, b in zip(found, plain))
        if worst > 5e-3:
            raise Failed(f"losses {found} against the plain loss's {plain}: {worst:.2%} apart")
        line += f", within {worst:.2%} of the plain loss"
    return line


def part_speedrun():
    data = "gcide" if os.path.exists(os.path.join(ROOT, "data/gcide/train.bin")) else "synth"
    need(f"data/{data}", "python dev/synth_data.py")
    return f"on {data}: " + trained("speedrun", ["config/speedrun_gcide.py", f"--dataset={data}", "--max_iters=8",
                                                 "--checkpoint_interval=-1", *FEW], expect=[r"^muon: "])[2]


def part_llama():
    need("data/shakespeare_char/train.bin", "python data/shakespeare_char/prepare.py")
    return trained("llama", ["config/train_llama_shakespeare_char.py", "--max_tokens=0", "--max_iters=10",
                             "--warmup_tokens=0", "--warmup_iters=2", "--lr_decay_iters=10", *FEW])[2]


def part_graph():
    need("data/shakespeare_char/train.bin", "python data/shakespeare_char/prepare.py")
    found, out, line = trained("graph", [*CHAR, "--max_iters=300", "--lr_decay_iters=300", "--eval_interval=300",
                                         "--always_save_checkpoint=True"])
    if "cuda_graph: off" in out:
        raise Failed(last_line(out[:out.index("cuda_graph: off") + 200]))
    if not found[-1] < 0.8 * found[0]:
        raise Failed(f"the loss did not fall: {found[0]:.4f} -> {found[-1]:.4f}")
    return line


def part_sample():
    need(os.path.join(RUNS, "graph", "ckpt.pt"), "the graph part writes it")
    code, out = sh([PY, "sample.py", f"--out_dir={os.path.join(RUNS, 'graph')}", "--num_samples=3",
                    "--max_new_tokens=200", "--start=ROMEO:"], "sample.log")
    samples = re.findall(r"^ROMEO:\n(.*?)\n---------------$", out, re.M | re.S)  # sample.py's layout
    if code or len(samples) != 3 or not all(samples):
        raise Failed(f"exit {code}, {len(samples)} samples: {last_line(out)}")
    return f"3 samples of 200 tokens, the first: {samples[0][:50]!r}"


EXPORT_CHECK = """
import sys, torch
from transformers import AutoModelForCausalLM
from gpt.checkpoint import load_checkpoint, model_from_checkpoint
run, folder = sys.argv[1], sys.argv[2]
ours = model_from_checkpoint(load_checkpoint(run + "/ckpt.pt"), run).cuda().eval()
theirs = AutoModelForCausalLM.from_pretrained(folder).cuda().eval()
idx = torch.randint(0, 65, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
with torch.no_grad():
    a, b = ours(idx, idx)[0].float(), theirs(idx).logits.float()
print(f"max |logits difference| {(a - b).abs().max().item():.2e} over {tuple(a.shape)}")
"""


def part_export():
    run = os.path.join(RUNS, "graph")
    need(os.path.join(run, "ckpt.pt"), "the graph part writes it")
    folder = os.path.join(RUNS, "graph-hf")
    shutil.rmtree(folder, ignore_errors=True)
    # export.py's own check reloads on the CPU; the one below does it on the GPU
    code, out = sh([PY, "export.py", f"--out_dir={run}", f"--export_dir={folder}", "--verify=False"], "export.log")
    if code:
        raise Failed(f"export.py: exit {code}: {last_line(out)}")
    code, out = sh([PY, "-c", EXPORT_CHECK, run, folder], "export-reload.log")
    m = re.search(r"max \|logits difference\| ([0-9.e+-]+)", out)
    if code or not m or float(m.group(1)) > 1e-3:  # float32 on both sides: kernel choices, not bf16
        raise Failed(f"exit {code}: {last_line(out)}")
    return f"transformers reloads it: {m.group(0)}"


ONE_GPU = {}  # the one-GPU losses the parallel parts compare with, run once for all of them


PARALLEL = [*CHAR, "--max_iters=20", "--lr_decay_iters=20", "--eval_interval=20", "--cuda_graph=False",
            "--checkpoint_interval=-1"]


def part_parallel(nproc, parallelism, *extra, forked=False):
    """N processes' losses against one GPU's; extra: more settings (ddp_sync='hooks' with the step's graph)."""
    def check():
        need("data/shakespeare_char/train.bin", "python data/shakespeare_char/prepare.py")
        args = PARALLEL
        if "losses" not in ONE_GPU:
            code, out, out_dir = train("one-gpu", args)
            if code:
                raise Failed(f"one GPU: exit {code}: {last_line(out)}")
            ONE_GPU["losses"] = losses(out_dir)
        one = ONE_GPU["losses"]
        name = f"forked-{nproc}" if forked else f"{parallelism}{'-hooks' if extra else ''}-{nproc}"
        found, out, line = trained(name, [*args, f"--parallelism={parallelism}", *extra], nproc, forked=forked)
        if "cuda_graph: off" in out:
            raise Failed(last_line(out[:out.index("cuda_graph: off") + 200]))
        worst = max(abs(a - b) / b for a, b in zip(found, one))
        if len(found) != len(one) or worst > 5e-3:
            raise Failed(f"losses {[round(x, 4) for x in found]} against one GPU's {[round(x, 4) for x in one]}")
        return line + f", each step within {worst:.2%} of one GPU's"
    return check


# a rank that dies between two replays of the step's graph: the survivor's next replay waits in an all-reduce
# recorded in its graph, where Python's signal handlers cannot run; torchrun must still end the run
DYING_RANK = """
import os, runpy, sys
sys.path.insert(0, os.getcwd())
from gpt.training import stepgraph
replay, calls = stepgraph.StepGraph.run, [0]
def dies(self, batches):
    calls[0] += 1
    if os.environ["RANK"] == "1" and calls[0] == 20:
        os._exit(3)  # as if its GPU or its node went away
    return replay(self, batches)
stepgraph.StepGraph.run = dies
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


def part_forked_unset():
    """Forked workers of a torchrun that counted the GPUs with CUDA itself: one line naming the variable."""
    need("data/shakespeare_char/train.bin", "python data/shakespeare_char/prepare.py")
    code, out, _ = train("forked-unset-2", PARALLEL, 2, forked=True, env={"PYTORCH_NVML_BASED_CUDA_CHECK": ""})
    errors = [x for x in out.splitlines() if x.startswith("error:")]
    if code == 0 or len(errors) != 1 or "PYTORCH_NVML_BASED_CUDA_CHECK=1" not in errors[0]:
        raise Failed(f"exit {code}, error lines {errors}: {last_line(out)}")
    return f"exit {code}: {errors[0][:90]}..."


def part_dying_rank():
    need("data/shakespeare_char/train.bin", "python data/shakespeare_char/prepare.py")
    script, out_dir = os.path.join(RUNS, "dying_rank.py"), os.path.join(RUNS, "ddp-hooks-dies-2")
    shutil.rmtree(out_dir, ignore_errors=True)
    with open(script, "w") as f:
        f.write(DYING_RANK)
    t = time.time()
    code, out = sh([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script, *CHAR,
                    "--max_iters=2000", "--eval_interval=2000", "--checkpoint_interval=-1", "--ddp_sync=hooks",
                    "--cuda_graph=True", f"--out_dir={out_dir}"], "ddp-hooks-dies-2.log", timeout=240)
    steps = [int(n) for n in re.findall(r"^(?:\[rank0\]: )?iter (\d+):", out, re.M)]
    if code in (0, 124) or "cuda_graph: off" in out or not steps or max(steps) < 18:
        last = max(steps, default=None)
        raise Failed(f"exit {code} after {time.time() - t:.0f}s, last step {last}: {last_line(out)}")
    return f"rank 1 gone at step 19: torchrun ended the run {time.time() - t:.0f}s after launch, exit {code}"


def gpus():
    return torch.cuda.device_count()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="", help="comma-separated part names (default: all that this machine runs)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA GPU here: the GPU check runs on a GPU machine (the CPU tests are pytest's)")
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(RUNS, exist_ok=True)
    parts = {"tests": part_tests, "gpt2": part_gpt2, "gpt2-compile": part_gpt2_compile, "fused-loss": part_fused_loss,
             "speedrun": part_speedrun, "llama": part_llama, "graph": part_graph, "sample": part_sample,
             "export": part_export}
    for n in (2, 4, 8):
        if gpus() >= n:
            parts[f"ddp-{n}"] = part_parallel(n, "ddp")
            parts[f"fsdp-{n}"] = part_parallel(n, "fsdp")
            parts[f"ddp-hooks-{n}"] = part_parallel(n, "ddp", "--ddp_sync=hooks", "--cuda_graph=True")
            parts[f"forked-{n}"] = part_parallel(n, "ddp", "--ddp_sync=hooks", "--cuda_graph=True", forked=True)
    if gpus() >= 2:
        parts["forked-unset-2"] = part_forked_unset
        parts["ddp-hooks-dies-2"] = part_dying_rank
    chosen = [x for x in a.parts.split(",") if x] or list(parts)
    unknown = [x for x in chosen if x not in parts]
    if unknown:
        raise SystemExit(f"error: unknown part {', '.join(unknown)}: the parts here are {', '.join(parts)}")
    # a copy of the checkout without its .git (a remote machine's) names its commit in .rev
    rev = os.path.join(ROOT, ".rev")
    git = lambda *args: subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = open(rev).read().strip() if os.path.exists(rev) else git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = not os.path.exists(rev) and git("status", "--porcelain", "--untracked-files=no")
    head = (f"GPU check: {torch.cuda.get_device_name(0)} x {gpus()}, torch {torch.__version__}, commit {commit}"
            f"{' (with uncommitted changes)' if dirty else ''}, {time.strftime('%Y-%m-%d')}")
    print(head, flush=True)
    if "tests" in chosen:  # run beside the rest, reported last
        BESIDE["tests"] = ThreadPoolExecutor(1).submit(sh, TESTS, "tests.log")
        chosen = [x for x in chosen if x != "tests"] + ["tests"]
    rows, t_all = [], time.time()
    for name in chosen:
        t = time.time()
        try:
            rows.append((name, "pass", time.time() - t, parts[name]()))
        except Failed as e:
            rows.append((name, "FAIL", time.time() - t, str(e)))
        rows[-1] = (*rows[-1][:2], time.time() - t, rows[-1][3])
        print(f"  {name}: {rows[-1][1]} ({rows[-1][2]:.0f}s) {rows[-1][3]}", flush=True)
    failed = [r for r in rows if r[1] != "pass"]
    lines = [head, "", "| part | result | seconds | what decided it |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {result} | {seconds:.0f} | {what} |" for name, result, seconds, what in rows]
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} parts passed in {time.time() - t_all:.0f}s; "
                  f"logs in {OUT} (and all of them in its gpu-check-logs.tgz)"]
    with open(os.path.join(OUT, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(["tar", "czf", "gpu-check-logs.tgz", "--exclude=gpu-check-logs.tgz", "."], cwd=OUT)  # one file
    print("\n" + "\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
