#!/usr/bin/env python3
"""
The time-to-quality comparison (docs/speedrun.md), on one GPU machine, back to back:

1. data/<--dataset> (gcide by default: train.bin, val.bin), if missing, from its gzipped text (--gcide, or
   --text): gcide's with the benchmark's make_corpus.py, techdocs' with dev/techdocs.py --text
   (the same cut and tokens);
2. karpathy/nanoGPT's own train.py (a copy of the --anchor folder, run in a scratch folder under --out)
   on the benchmark's config for that corpus (--nanogpt_config: gcide_nanogpt.py,
   dev/techdocs_nanogpt.py), its stdout lines timestamped here;
3. this project's recipe (--config, config/speedrun_gcide.py) once per seed, its checkpoint at the end;
   and, with --curve, one more run of the first seed that also saves a checkpoint every --curve_tokens
   (those saves cost seconds, so its times are drawn, not reported);
4. every saved checkpoint scored by one pass over the whole of val.bin (full_split_loss, below: every
   token once, in order); nanoGPT's last checkpoint's score is the target;
5. --out/speedrun.md (card, torch, commit, seeds, time and tokens to the target) and --out/speedrun.png
   (val loss against seconds since launch, both trainers). With --nproc=N this project's runs go under
   torchrun on N GPUs, their files named -Ngpu (seed1337-2gpu/, speedrun-2gpu.md, ...) beside a one-GPU
   call's in the same --out; another corpus's files are named after it (nanogpt-techdocs/,
   seed1337-techdocs/, speedrun-techdocs.md, ...) beside gcide's.

Times are seconds since each process was launched (the moment its stdout line reached this script, which
runs it unbuffered), so start-up, compilation and evaluations all count.

    python dev/speedrun.py --anchor=.shared/anchors/nanogpt --corpus_script=.shared/bench/make_corpus.py \\
        --gcide=.shared/data/gcide.txt.gz --nanogpt_config=.shared/bench/gcide_nanogpt.py --seeds=1337,1,2
    python dev/speedrun.py --anchor=.shared/anchors/nanogpt --dataset=techdocs \\
        --text=.shared/data/techdocs.txt.gz --ranks=.shared/data/gpt2.tiktoken \\
        --nanogpt_config=dev/techdocs_nanogpt.py --seeds=1337,1,2
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# a corpus's own builder, run with --text to make data/<dataset> (gcide has none: the benchmark's make_corpus.py)
BUILDERS = {"techdocs": "dev/techdocs.py"}

EVAL_LINE = re.compile(r"(?:\[rank\d+\]: )?step (\d+): .*?val loss ([0-9.]+)(?:.*?([0-9.]+)s since launch)?")
ITER_LINE = re.compile(r"iter (\d+): .*?time ([0-9.]+)ms")


def run_timestamped(cmd, cwd, log_path, env=None):
    """Run cmd, echoing its output; every line is stored with the seconds since launch at which it arrived
    (log_path, JSON lines). Returns [(seconds, line)]. Fails with the output's tail if cmd fails."""
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines = []
    with open(log_path, "w") as log:
        for line in proc.stdout:
            t = time.time() - start
            line = line.rstrip("\n")
            lines.append((t, line))
            log.write(json.dumps({"t": round(t, 3), "line": line}) + "\n")
            print(f"[{t:7.1f}s] {line}", flush=True)
    if proc.wait():
        tail = "\n".join(line for _, line in lines[-20:])
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return lines


def fresh_caches(out, name):
    """Environment for a cold run: its own empty Triton, inductor and CUDA-driver cache folders (under
    out/caches/name; the driver's holds what it compiled from PTX, such as kernels a library generates at run
    time), so no run reuses kernels another one compiled; a second launch with the same env is the warm run."""
    folder = os.path.join(out, "caches", name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return {"TRITON_CACHE_DIR": os.path.join(folder, "triton"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
            "CUDA_CACHE_PATH": os.path.join(folder, "cuda")}


def parse_evals(lines):
    """The evaluation lines, as [{'step', 'val' (the trainer's own estimate), 't' (arrival), 'since_launch'
    (our train.py's own clock, None for nanoGPT)}]."""
    out = []
    for t, line in lines:
        m = EVAL_LINE.match(line)
        if m:
            out.append(dict(step=int(m.group(1)), val=float(m.group(2)), t=t,
                            since_launch=float(m.group(3)) if m.group(3) else None))
    return out


def breakdown(lines):
    """Where a train.py run's time went, from its timestamped lines [(seconds, line)]: when its first step began
    (the startup line), the median step of its iter lines after step 20 (ms), and the seconds each evaluation
    (from the iter line before it, so with the steps since that line) and each checkpoint save took (from the line
    before "saving checkpoint", so with any wait for the previous save's write, to the line after it, so with the
    step that follows), and the median of the steps logged in the 10 lines after each save (async_save: while the
    thread writes it)."""
    steps = [float(m.group(2)) for _, line in lines if (m := ITER_LINE.match(line)) and int(m.group(1)) > 20]
    after_save = [float(m.group(2)) for i, (_, line) in enumerate(lines) if (m := ITER_LINE.match(line))
                  and any(seen.startswith("saving checkpoint") for _, seen in lines[max(0, i - 10):i])]
    evals = [round(t - t0, 3) for (t0, before), (t, line) in zip(lines, lines[1:])
             if EVAL_LINE.match(line) and ITER_LINE.match(before)]
    saves = [round(t - t0, 3) for (t0, _), (_, saving), (t, _) in zip(lines, lines[1:], lines[2:])
             if saving.startswith("saving checkpoint")]
    return dict(first_step=next((round(t, 3) for t, line in lines if line.startswith("startup:")), None),
                step_ms=statistics.median(steps) if steps else None, evals=evals, saves=saves,
                after_save_ms=statistics.median(after_save) if after_save else None)


def full_split_loss(model, path, block_size, batch_size, device, ctx, dtype="uint16"):
    """The mean loss over a whole token file (a val.bin), every token predicted exactly once, in order: the
    file cut into consecutive windows of block_size tokens (the last one shorter), each predicting its next
    tokens, batch_size windows at a time. Unlike estimate_loss's random windows it has no sampling noise,
    so two checkpoints (or two trainers) scored by it differ only by their models."""
    import numpy as np
    import torch

    from gpt.data import open_tokens
    tokens = open_tokens(path, dtype)
    n = len(tokens) - 1  # positions with a next token to predict
    starts = list(range(0, n, block_size))
    full = [s for s in starts if s + block_size <= n]
    batches = [full[i:i + batch_size] for i in range(0, len(full), batch_size)]
    batches += [[s] for s in starts if s + block_size > n]  # the shorter last window, on its own
    total = torch.zeros((), dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in batches:
            length = min(block_size, n - batch[0])
            window = np.stack([tokens[s:s + length + 1] for s in batch]).astype(np.int64)
            xy = torch.from_numpy(window).to(device)
            with ctx:
                _, loss = model(xy[:, :-1], xy[:, 1:])
            total += loss.double() * xy[:, 1:].numel()
    model.train(was_training)
    return total.item() / n


def score(ckpt_path, val_path, device, batch_size=16):
    """(iter_num, tokens seen, full val loss) of a checkpoint (ours or nanoGPT's)."""
    # torch, the gpt package and matplotlib are imported where used: this process must not load torch (into
    # the page cache too) before nanoGPT's cold run, which it times
    import torch

    from gpt.checkpoint import load_checkpoint, model_from_checkpoint
    from gpt.runtime import hardware
    ckpt = load_checkpoint(ckpt_path)
    model = model_from_checkpoint(ckpt, ckpt_path).to(device)
    cfg = ckpt.get("config", {})
    tokens = ckpt["iter_num"] * cfg.get("batch_size", 0) * cfg.get("block_size", 0) * \
        cfg.get("gradient_accumulation_steps", 0)
    ctx = hardware.autocast(device.split(":")[0], hardware.resolve_dtype("auto", device.split(":")[0]))
    loss = full_split_loss(model, val_path, model.config.block_size, batch_size, device, ctx)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return ckpt["iter_num"], tokens, loss


def curve(evals, scores):
    """[(seconds, step, tokens, full val)] of scored checkpoints, timed by their step's evaluation line."""
    at = {e["step"]: e["t"] for e in evals}
    return sorted((at[step], step, tokens, loss) for step, tokens, loss in scores if step in at)


def first_at_or_below(points, target):
    """The first (seconds, step, tokens, loss) point at or below target, or None."""
    return next((p for p in sorted(points) if p[3] <= target), None)


def write_table(path, env, target, reference, runs):
    """The markdown report. reference: nanoGPT's (seconds, step, tokens, loss); runs: {seed: points}."""
    data = f"; data/{env['dataset']}" if env.get("dataset") else ""
    rows = [f"- card: {env['card']}; torch {env['torch']}; commit {env['commit']}{data}",
            f"- target: nanoGPT's step-{reference[1]} checkpoint, val {target:.4f} over the whole of val.bin, "
            f"its evaluation line at {reference[0]:.1f} s after launch ({reference[2]:,} tokens)", "",
            "| run | seed | final val | time to target (s) | % of nanoGPT's time | tokens to target |",
            "|---|---|---|---|---|---|",
            f"| nanoGPT | 1337 | {target:.4f} | {reference[0]:.1f} | 100% | {reference[2]:,} |"]
    for seed, points in runs.items():
        hit, final = first_at_or_below(points, target), max(points)[3] if points else float("nan")
        if hit:
            rows.append(f"| this project | {seed} | {final:.4f} | {hit[0]:.1f} | {100 * hit[0] / reference[0]:.0f}% "
                        f"| {hit[2]:,} |")
        else:
            rows.append(f"| this project | {seed} | {final:.4f} | not reached | - | - |")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    return "\n".join(rows)


def plot(path, nanogpt_evals, reference, target, runs, curve_points=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot([e["t"] for e in nanogpt_evals if e["step"]], [e["val"] for e in nanogpt_evals if e["step"]], "--",
            color="gray", label="nanoGPT (its own 20-batch val estimate)")
    ax.plot([reference[0]], [target], "o", color="black", label="nanoGPT's final checkpoint, whole val.bin")
    ax.axhline(target, color="black", lw=0.5)
    ax.axvline(reference[0] / 4, color="black", lw=0.5, ls=":", label="a quarter of nanoGPT's time")
    for seed, points in runs.items():
        ax.plot([p[0] for p in points], [p[3] for p in points], "s", label=f"this project, seed {seed}, whole val.bin")
    if curve_points:
        ax.plot([p[0] for p in curve_points], [p[3] for p in curve_points], "-o", ms=3,
                label="this project, checkpoints along the way (their saves included)")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("val loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def environment():
    import torch
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    rev = os.path.join(ROOT, ".rev")  # a copy of the tree sent to a GPU machine carries its commit here
    if os.path.exists(rev):
        commit = open(rev).read().strip()
    else:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
    return dict(card=card, torch=torch.__version__, commit=commit)


def nanogpt_settings(path):
    """The settings of nanoGPT's config file: plain Python, run as nanoGPT's configurator runs it."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: --nanogpt_config {path} does not exist")
    scope = {}
    with open(path) as f:
        exec(f.read(), scope)
    return scope


def corpus(data, dataset, text, corpus_script, ranks):
    """data (the folder of train.bin and val.bin), built from the gzipped text when it lacks them: by the
    corpus's own builder where it has one (dev/techdocs.py --text), else by the benchmark's make_corpus.py.
    Both cut and tokenize alike, so either gives the same files."""
    if all(os.path.exists(os.path.join(data, f)) for f in ("train.bin", "val.bin")):
        return
    builder = BUILDERS.get(dataset)
    env = {**os.environ, **({"GPT2_TIKTOKEN_FILE": os.path.abspath(ranks)} if ranks else {})}
    if text and builder:
        cmd = [sys.executable, os.path.join(ROOT, builder), f"--text={text}", f"--out_dir={data}"]
    elif text and corpus_script:
        cmd = [sys.executable, corpus_script, "--input", text, "--out", data] + (["--ranks", ranks] if ranks else [])
    elif builder:
        raise SystemExit(f"error: {data} has no train.bin and val.bin: build them with `python {builder} "
                         f"--text=.shared/data/{dataset}.txt.gz` (the text it assembled), or pass that text here "
                         f"as --text")
    else:
        raise SystemExit(f"error: {data} has no train.bin and val.bin: pass --gcide (the corpus's text) and "
                         f"--corpus_script (the benchmark's make_corpus.py) to build them")
    if subprocess.run(cmd, env=env).returncode:
        raise SystemExit(f"error: {' '.join(cmd)} failed: {data} was not built")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--anchor", required=True, help="folder with karpathy/nanoGPT's train.py, model.py, configurator.py")
    p.add_argument("--nanogpt_config", required=True, help="nanoGPT's recipe for --dataset: the benchmark's "
                   "gcide_nanogpt.py, dev/techdocs_nanogpt.py")
    p.add_argument("--dataset", default="gcide", help="the corpus, data/<dataset>: gcide or techdocs")
    p.add_argument("--gcide", "--text", dest="text", default="", help="the corpus's gzipped text, to build "
                   "data/<dataset> where it is missing: gcide.txt.gz (with --corpus_script), or techdocs.txt.gz "
                   "(built by dev/techdocs.py)")
    p.add_argument("--corpus_script", default="", help="the benchmark's make_corpus.py, for a corpus without "
                   "its own builder (gcide)")
    p.add_argument("--ranks", default="", help="gpt2.tiktoken for building the corpus (default: "
                   "make_corpus.py's own, or $GPT2_TIKTOKEN_FILE)")
    p.add_argument("--config", default=os.path.join(ROOT, "config", "speedrun_gcide.py"))
    p.add_argument("--seeds", default="1337,1,2")
    p.add_argument("--out", default=os.path.join(ROOT, "out-speedrun-compare"))
    p.add_argument("--curve", type=int, default=1, help="1: one more run saving checkpoints along the way")
    p.add_argument("--warm", type=int, default=0, help="1: after the cold runs (each with empty compile caches), "
                   "launch the first seed again with the caches its cold run filled")
    p.add_argument("--curve_tokens", type=int, default=65536 * 40)
    p.add_argument("--device", default="cuda")
    p.add_argument("--skip_nanogpt", action="store_true", help="reuse --out's nanoGPT run")
    p.add_argument("--extra", default="", help="more --key=value settings for this project's runs")
    p.add_argument("--nanogpt_extra", default="", help="more --key=value settings for nanoGPT's run (e.g. "
                   "--compile=False: eager is the faster nanoGPT in a run this short)")
    p.add_argument("--reference", default="", help="SECONDS,LOSS: nanoGPT's time and score measured elsewhere "
                   "(another call), instead of running it here: for comparisons of this project's runs alone "
                   "(e.g. one GPU against two), whose times are then not a ratio to a nanoGPT run of this machine")
    p.add_argument("--tag", default="", help="a name for this call's runs, so that several recipes (--config, "
                   "--extra) share one nanoGPT run in --out (with --skip_nanogpt)")
    p.add_argument("--nproc", type=int, default=1, help="N > 1: this project's runs under torchrun on N GPUs "
                   "(the same global batch: gradient_accumulation_steps is shared by the processes)")
    p.add_argument("--fork", type=int, default=0, help="1: with --nproc, torchrun starts its workers as forks of "
                   "itself (--run-path --start-method=fork), so that no worker imports torch again")
    a = p.parse_args(argv)
    from gpt.data import is_dataset_name
    if a.fork and a.nproc == 1:
        raise SystemExit("error: --fork=1 forks torchrun's workers: give --nproc=N (N > 1) too, or leave --fork out")
    if not is_dataset_name(a.dataset):
        raise SystemExit(f"error: --dataset {a.dataset!r} must be the name of a folder in data/")
    nano_cfg = nanogpt_settings(a.nanogpt_config)
    if nano_cfg.get("dataset") != a.dataset:
        raise SystemExit(f"error: --nanogpt_config {a.nanogpt_config} trains on {nano_cfg.get('dataset')!r}, not "
                         f"--dataset={a.dataset}: give nanoGPT's recipe for {a.dataset}")
    data = os.path.join(ROOT, "data", a.dataset)
    corpus(data, a.dataset, a.text, a.corpus_script, a.ranks)
    val = os.path.join(data, "val.bin")
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    # gcide's files keep their names; another corpus's are named after it, so both can share one --out
    named = "" if a.dataset == "gcide" else f"-{a.dataset}"

    # nanoGPT: its three files in a scratch folder, which its train.py runs in (it reads ./configurator.py
    # and ./data/<dataset>/)
    nano = os.path.join(out, f"nanogpt{named}")
    if a.reference:
        seconds, target = map(float, a.reference.split(","))
        steps = nano_cfg["max_iters"]
        tokens = steps * nano_cfg["batch_size"] * nano_cfg["block_size"] * nano_cfg["gradient_accumulation_steps"]
        nano_evals, reference = [], (seconds, steps, tokens, target)
    elif not a.skip_nanogpt:
        shutil.rmtree(nano, ignore_errors=True)
        os.makedirs(os.path.join(nano, "data"))
        for f in ("train.py", "model.py", "configurator.py"):
            shutil.copy(os.path.join(a.anchor, f), nano)
        os.symlink(data, os.path.join(nano, "data", a.dataset))
        run_timestamped([sys.executable, "train.py", os.path.abspath(a.nanogpt_config), f"--out_dir={nano}/out",
                         *a.nanogpt_extra.split()], nano, os.path.join(out, f"nanogpt{named}.jsonl"),
                        env=fresh_caches(out, f"nanogpt{named}"))
    if not a.reference:
        nano_lines = [(r["t"], r["line"]) for r in map(json.loads, open(os.path.join(out, f"nanogpt{named}.jsonl")))]
        nano_evals = parse_evals(nano_lines)
        step, tokens, target = score(os.path.join(nano, "out", "ckpt.pt"), val, a.device)
        print(f"score: nanoGPT{named}: step {step}, full val {target:.4f}", flush=True)
        reference = curve(nano_evals, [(step, tokens, target)])[0]

    extra = [f"--dataset={a.dataset}", *a.extra.split()]
    trainer = [sys.executable, "train.py"] if a.nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.nproc}",
         *(["--run-path", "--start-method=fork"] if a.fork else []), "train.py"]
    # a torchrun call's files beside the one-GPU call's, a tagged recipe's beside the others
    tag = named + (f"-{a.tag}" if a.tag else "") + ("" if a.nproc == 1 else f"-{a.nproc}gpu" + "-fork" * a.fork)
    runs, evals, env = {}, {}, {}

    def save(curve_points=None):
        """The table and the JSON of the runs so far: rewritten after every run, so a call cut short (a time
        limit, a crash) keeps the scores it made. Returns the table."""
        if not env:  # after the first run, since it initialises CUDA in this process
            env.update(environment(), dataset=a.dataset)
        table = write_table(os.path.join(out, f"speedrun{tag}.md"), env, target, reference, runs)
        with open(os.path.join(out, f"speedrun{tag}.json"), "w") as f:
            json.dump(dict(target=target, reference=reference, runs=runs, curve=curve_points,
                           nanogpt_evals=nano_evals, evals=evals, env=env), f, indent=1)
        return table

    seeds = [int(s) for s in a.seeds.split(",")]
    # every seed cold (its own empty compile caches); then, with --warm, the first seed launched again with
    # the caches its cold run filled, as a user's second run on the same machine
    # a forked worker can use CUDA only if torchrun's process never initialised it: NVML answers its device count
    fork_env = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"} if a.fork else {}
    launches = [(seed, seed, f"seed{seed}{tag}", {**fresh_caches(out, f"seed{seed}{tag}"), **fork_env})
                for seed in seeds]
    if a.warm:
        launches.append((f"{seeds[0]} (warm: second launch)", seeds[0], f"seed{seeds[0]}{tag}-warm", launches[0][3]))
    for key, seed, name, caches in launches:
        run = os.path.join(out, name)
        shutil.rmtree(run, ignore_errors=True)
        lines = run_timestamped([*trainer, a.config, f"--seed={seed}", f"--out_dir={run}", *extra],
                                ROOT, os.path.join(out, f"{name}.jsonl"), env=caches)
        evals[key] = parse_evals(lines)
        runs[key] = curve(evals[key], [score(c, val, a.device) for c in sorted(glob.glob(f"{run}/ckpt*.pt"))])
        for _, step, _, loss in runs[key]:
            print(f"score: {name}: step {step}, full val {loss:.4f}", flush=True)
        save()
    curve_points = None
    if a.curve:
        run = os.path.join(out, f"curve{tag}")
        shutil.rmtree(run, ignore_errors=True)
        seed = int(a.seeds.split(",")[0])
        lines = run_timestamped([*trainer, a.config, f"--seed={seed}", f"--out_dir={run}",
                                 f"--ckpt_every_tokens={a.curve_tokens}", *extra], ROOT,
                                os.path.join(out, f"curve{tag}.jsonl"))
        scores = [score(c, val, a.device) for c in sorted(glob.glob(f"{run}/ckpt*.pt"))]
        curve_points = curve(parse_evals(lines), scores)

    table = save(curve_points)
    plot(os.path.join(out, f"speedrun{tag}.png"), nano_evals, reference, target, runs, curve_points)
    print(table)
    print(f"wrote {out}/speedrun{tag}.md, speedrun{tag}.png, speedrun{tag}.json")


if __name__ == "__main__":
    main()
