"""
Where a DDP training step's time goes, on this machine: the GPUs' topology, the all-reduce bus bandwidth,
and for the step of GPT-2 124M (config/train_gpt2.py's shapes, synthetic tokens, compile on) the time in
forward+backward of the micro-steps without gradient sync, the all-reduce time the last micro-step's
backward pass leaves exposed, the optimizer, and the rest. See docs/scaling.md, "If your scaling is poor".

$ torchrun --standalone --nproc_per_node=4 dev/ddp_profile.py
$ torchrun --standalone --nproc_per_node=4 dev/ddp_profile.py --variants="default;reduce_dtype=bfloat16"
$ python dev/ddp_profile.py          (one GPU: a DDP of one process, the all-reduce is a no-op)

Settings (--key=value): steps (10 timed, after `warmup` 3: the first compiles), micro_steps (0: 40 split over
the processes, as config/train_gpt2.py), batch_size 12, block_size 1024, n_layer/n_head/n_embd/vocab_size
(GPT-2 124M), compile 1, dtype (bfloat16 on GPUs), sizes_mb (all-reduce message sizes), variants: `;`-separated
sets of gpt/distributed.wrap options (reduce_dtype, bucket_mb, bucket_view, static_graph) and optimize_ddp=0
(torch.compile without DDPOptimizer's graph splitting), each timed in turn. Rank 0 prints the tables and
writes $OUT/ddp_profile_<N>gpu.json ($OUT, or the current folder).
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpt.runtime import (
    distributed,
    hardware,  # noqa: E402
)
from gpt.training.evaluation import all_ranks_mean  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

S = dict(steps=10, warmup=3, micro_steps=0, batch_size=12, block_size=1024, n_layer=12, n_head=12, n_embd=768,
         vocab_size=50304, compile=1, dtype="auto", device="auto",
         sizes_mb="1,2,4,8,16,32,64,128,256,512", variants="default")
WRAP_KEYS = {"reduce_dtype": str, "bucket_mb": float, "bucket_view": lambda v: v in ("1", "True", "true"),
             "static_graph": lambda v: v in ("1", "True", "true"), "optimize_ddp": lambda v: v in ("1", "True", "true")}


def parse_args(argv):
    for arg in argv:
        key, _, value = arg.removeprefix("--").partition("=")
        if key not in S or not _:
            sys.exit(f"error: unknown or malformed argument {arg!r}; known: " + ", ".join(f"--{k}=" for k in S))
        S[key] = type(S[key])(value) if not isinstance(S[key], str) else value


def parse_variant(text):
    opts = {}
    for item in filter(None, text.strip().split(",")):
        if item == "default":
            continue
        key, _, value = item.partition("=")
        if key not in WRAP_KEYS:
            sys.exit(f"error: unknown variant option {key!r}; known: {', '.join(WRAP_KEYS)}")
        opts[key] = WRAP_KEYS[key](value)
    return opts


def run(cmd):
    if not shutil.which(cmd[0]):
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"({' '.join(cmd)} failed: {e})"


def topology(device_type):
    """What links the GPUs: nvidia-smi's matrix and NVLink status, and which pairs torch can reach P2P."""
    topo = {"torch": torch.__version__, "world_size": dist.get_world_size(),
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}
    if device_type != "cuda":
        return topo
    n = torch.cuda.device_count()
    topo.update(gpus=[torch.cuda.get_device_name(i) for i in range(n)],
                nccl=".".join(map(str, torch.cuda.nccl.version())),
                p2p=[[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)],
                topo_m=run(["nvidia-smi", "topo", "-m"]), nvlink_s=run(["nvidia-smi", "nvlink", "-s"]))
    matrix = topo["topo_m"] or ""
    links = [line for line in (topo["nvlink_s"] or "").splitlines() if "GB/s" in line and "inactive" not in line]
    topo["nvlink"] = any(w.startswith("NV") and w[2:].isdigit() for w in matrix.split()) or bool(links)
    topo["nvlink_active_links"] = len(links)
    return topo


def clock(cuda):
    """mark() a point in the GPU's stream (CUDA events) or in time (CPU); ms(a, b) between two marks."""
    if cuda:
        def mark():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return mark, lambda a, b: a.elapsed_time(b)
    return time.perf_counter, lambda a, b: (b - a) * 1000


def allreduce_bandwidth(device, sizes, extra):
    """Median time of an all-reduce (SUM) of each message size, float32 and bfloat16; the bus bandwidth as
    nccl-tests reports it: algbw (bytes / time) x 2(n-1)/n, what each link carries in a ring."""
    n, rows = dist.get_world_size(), []
    mark, ms = clock(device.startswith("cuda"))
    for dtype in (torch.float32, torch.bfloat16):
        for size in sorted(set(sizes) | {extra}):
            t = torch.ones(size // dtype.itemsize, dtype=dtype, device=device)
            times = []
            for i in range(3 + (5 if size >= 64 << 20 else 15)):
                dist.barrier()
                a = mark()
                dist.all_reduce(t)
                b = mark()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                if i >= 3:
                    times.append(ms(a, b))
            med = statistics.median(times)
            algbw = size / med / 1e6  # GB/s
            rows.append(dict(dtype=str(dtype).split(".")[1], bytes=size, gradients=size == extra, ms=med,
                             algbw=algbw, busbw=algbw * 2 * (n - 1) / n))
            del t
    return rows


def profile_step(opts, device, dtype, k, rank, world):
    """Time the DDP training step of the model (train.py's loop, synthetic tokens) with these wrap options."""
    device_type = device.split(":")[0]
    cfg = GPTConfig(n_layer=S["n_layer"], n_head=S["n_head"], n_embd=S["n_embd"], block_size=S["block_size"],
                    vocab_size=S["vocab_size"], bias=False, dropout=0.0)
    torch.manual_seed(1337)
    model = GPT(cfg).to(device)
    optimize_ddp = opts.pop("optimize_ddp", True)
    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = optimize_ddp
    ddp = distributed.wrap(model, "ddp", device_type, int(os.environ.get("LOCAL_RANK", 0)), dtype,
                           bool(S["compile"]) and hardware.can_compile(True, device_type), **opts)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
    ctx = hardware.autocast(device_type, dtype)
    gen = torch.Generator().manual_seed(rank)
    B, T = S["batch_size"], S["block_size"]
    batches = [torch.randint(0, S["vocab_size"], (2, B, T), generator=gen) for _ in range(k)]
    batches = [b.pin_memory() if device_type == "cuda" else b for b in batches]
    mark, ms = clock(device_type == "cuda")
    steps = []
    for step in range(S["warmup"] + S["steps"] + 1):  # one more: its start ends the last timed step
        marks = [mark()]
        if step == S["warmup"] + S["steps"]:
            steps.append(marks)
            break
        loss_sum = 0.0
        for i in range(k):
            distributed.set_gradient_sync(ddp, i == k - 1)
            xy = batches[i].to(device, non_blocking=True)
            with ctx:
                _, loss = ddp(xy[0], xy[1])
                loss = loss / k
            marks.append(mark())
            loss_sum += loss.detach()
            loss.backward()
            marks.append(mark())
        distributed.full_tensor(torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)).item()  # as train.py
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(mark())
        all_ranks_mean(float(loss_sum), device)  # train.py's logged loss at log_interval=1
        steps.append(marks)
    if device_type == "cuda":
        torch.cuda.synchronize()
    rows = []
    for marks, after in zip(steps[S["warmup"]:-1], steps[S["warmup"] + 1:]):
        fwd = [ms(marks[2 * i], marks[2 * i + 1]) for i in range(k)]
        bwd = [ms(marks[2 * i + 1], marks[2 * i + 2]) for i in range(k)]
        nosync_bwd = statistics.median(bwd[:-1]) if k > 1 else float("nan")
        total = ms(marks[0], after[0])
        row = dict(nosync_fwd_bwd=sum(fwd[:-1]) + sum(bwd[:-1]), last_fwd=fwd[-1], last_bwd=bwd[-1],
                   micro_fwd=statistics.median(fwd), micro_bwd=nosync_bwd, exposed_allreduce=bwd[-1] - nosync_bwd,
                   optimizer=ms(marks[2 * k], marks[2 * k + 1]), total=total)
        row["rest"] = total - row["nosync_fwd_bwd"] - row["last_fwd"] - row["last_bwd"] - row["optimizer"]
        rows.append(row)
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    med["compute_bound"] = k * (med["micro_fwd"] + med["micro_bwd"]) + med["optimizer"]
    med["tokens_per_s"] = k * B * T * world / med["total"] * 1000
    del ddp, model, optimizer
    torch._dynamo.config.optimize_ddp = True
    if device_type == "cuda":
        torch.cuda.empty_cache()
    return med


def main():
    parse_args(sys.argv[1:])
    if "RANK" not in os.environ:  # plain python: a process group of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = hardware.resolve_device(S["device"])
    _, rank, _, world, device = distributed.init_process(device, "", 10)
    device_type = device.split(":")[0]
    dtype = hardware.resolve_dtype(S["dtype"], device_type)
    k = S["micro_steps"] or max(1, 40 // world)
    torch.set_float32_matmul_precision("high")
    say = print if rank == 0 else (lambda *a, **kw: None)
    result = {"settings": dict(S, micro_steps=k, dtype=dtype, device=device), "topology": topology(device_type)}
    topo = result["topology"]
    say(f"== topology: {world} process(es), {topo.get('gpus', [device])[0]}, torch {topo['torch']}, "
        f"NCCL {topo.get('nccl', '-')}, NVLink: {topo.get('nvlink', 'n/a')} "
        f"({topo.get('nvlink_active_links', 0)} active links)")
    for key in ("topo_m",):
        if topo.get(key):
            say(topo[key].rstrip())
    if "p2p" in topo:
        say("peer-to-peer access (torch.cuda.can_device_access_peer):",
            " ".join("".join("1" if p else "." for p in row) for row in topo["p2p"]))
    if topo["nccl_env"]:
        say("NCCL environment:", " ".join(f"{k}={v}" for k, v in topo["nccl_env"].items()))

    n_params = sum(p.numel() for p in GPT(GPTConfig(n_layer=S["n_layer"], n_head=S["n_head"], n_embd=S["n_embd"],
                                                    block_size=S["block_size"], vocab_size=S["vocab_size"],
                                                    bias=False)).parameters())
    sizes = [int(float(s) * 2**20) for s in S["sizes_mb"].split(",") if s]
    result["allreduce"] = allreduce_bandwidth(device, sizes, 4 * n_params)
    say(f"\n== all-reduce (SUM), {world} process(es); busbw = algbw x 2(n-1)/n (nccl-tests); "
        f"* = the model's fp32 gradients in one message ({4 * n_params / 2**20:.0f} MiB)")
    say(f"{'MiB':>8} {'fp32 ms':>9} {'fp32 busbw GB/s':>16} {'bf16 ms':>9} {'bf16 busbw GB/s':>16}")
    by = {(r["dtype"], r["bytes"]): r for r in result["allreduce"]}
    for size in sorted({b for _, b in by}):
        f, h = by[("float32", size)], by[("bfloat16", size)]
        say(f"{size / 2**20:>7.4g}{'*' if f['gradients'] else ' '} {f['ms']:>9.3f} {f['busbw']:>16.1f} "
            f"{h['ms']:>9.3f} {h['busbw']:>16.1f}")

    result["ddp"] = []
    for text in S["variants"].split(";"):
        med = profile_step(parse_variant(text), device, dtype, k, rank, world)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, med)
        result["ddp"].append({"variant": text, "per_rank": per_rank})
    say(f"\n== DDP step, {S['n_layer']} layers x {S['n_embd']}, {k} micro-steps of {S['batch_size']} x "
        f"{S['block_size']} per process, {dtype}, compile {bool(S['compile'])}; ms, medians of {S['steps']} steps "
        f"(rank 0; [min-max] over ranks where they differ by over 2%)")
    cols = [("nosync_fwd_bwd", "fwd+bwd no sync"), ("last_fwd", "last fwd"), ("last_bwd", "last bwd (sync)"),
            ("exposed_allreduce", "exposed all-reduce"), ("optimizer", "optimizer"), ("rest", "rest"),
            ("total", "step"), ("compute_bound", "step if no comm"), ("tokens_per_s", "tok/s")]
    for entry in result["ddp"]:
        say(f"-- {entry['variant']}")
        for key, name in cols:
            vals = [r[key] for r in entry["per_rank"]]
            spread = f"  [{min(vals):.1f}-{max(vals):.1f}]" if max(vals) > 1.02 * min(vals) + 0.05 else ""
            say(f"  {name:<20} {vals[0]:>12,.1f}{spread}")
        r0 = entry["per_rank"][0]
        say(f"  communication efficiency (step if no comm / step): {r0['compute_bound'] / r0['total']:.3f}")
    if rank == 0:
        out = os.environ.get("OUT", ".")
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"ddp_profile_{world}gpu.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
