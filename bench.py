"""Benchmark the training step and generation, nanoGPT's bench.py grown up: for each micro-batch size, ms per step,
tokens/s, MFU against the card's peak and peak memory; then generation speed with the KV cache (bf16 weights, on CUDA
the decode step replayed from a CUDA graph). Prints a table; writes the numbers, card, torch and git revision to JSON.
$ python bench.py                                   # GPT-2 124M, B=12 and 32, synthetic tokens
$ python bench.py --batch_sizes=12,32,64 --compile=False --gen_batch_sizes=1,10"""
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import torch
import torch._functorch.config
import torch.profiler

import configurator
from gpt import generation, optim
from gpt.data import check_output_file, find_dataset, list_shards, open_shard, open_tokens
from gpt.data.loader import check_ids, check_split, to_device
from gpt.optim import muon
from gpt.runtime import errors, hardware, settings
from gpt.runtime.files import atomic_write
from gpt.runtime.settings import BATCH_LIST, FRACTION, NOT_NEGATIVE, POSITIVE, SEED, Setting, at_least
from gpt.training import stepgraph
from gpt.training.step import set_lr, train_step
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
UNIT = (lambda v: 0 <= v <= 1, "between 0 and 1 (1: recompute nothing)")
batch_sizes: Setting(BATCH_LIST) = '12,32'  # micro-batch sizes to time, comma separated
block_size: Setting(POSITIVE) = 1024
n_layer: Setting(POSITIVE) = 12
n_head: Setting(POSITIVE) = 12
n_embd: Setting(POSITIVE) = 768
vocab_size: Setting(POSITIVE) = 50304
bias: Setting() = False
dropout: Setting(FRACTION) = 0.0
real_data: Setting() = False  # True: windows of data/<dataset>/train.bin; False: random tokens
dataset: Setting() = 'openwebtext'
data_dir: Setting() = ''  # real_data from this folder instead of data/<dataset>
optimizer: Setting() = 'adamw'  # or 'muon' (Muon for the blocks' matrices, AdamW the rest), as train.py's setting
learning_rate: Setting(POSITIVE) = 6e-4
weight_decay: Setting(NOT_NEGATIVE) = 1e-1
grad_clip: Setting(at_least(0, "0 (off) or more")) = 1.0
warmup_steps: Setting(NOT_NEGATIVE) = 10  # untimed steps (compilation, allocator warm-up)
timed_steps: Setting(POSITIVE) = 30
gen_batch_sizes: Setting(BATCH_LIST) = '1,10'  # generation benchmark batch sizes ('' to skip)
gen_tokens: Setting(POSITIVE) = 500
top_k: Setting(at_least(0, "0 (all tokens) or more")) = 200
seed: Setting(SEED) = 1337
device: Setting() = 'auto'
dtype: Setting() = 'auto'
compile: Setting() = True
activation_memory_budget: Setting(UNIT) = 1.0  # compile: below 1, recompute cheap activations to save memory
check_batch_size: Setting(at_least(0, "0 (skip) or more")) = 4  # first compare the fast path with the plain one
fused_loss: Setting() = False  # True: chunked linear + cross-entropy (False: lm_head + F.cross_entropy, nanoGPT's way)
cuda_graph: Setting() = False  # True: replay the whole training step from a CUDA graph, as in train.py
cudnn_attention: Setting() = True  # False: attention never takes cuDNN's kernel (flash instead), as train.py's option
profile: Setting() = False  # also write a table of kernel times over 3 steps per micro-batch, beside out_json
peak_flops: Setting(at_least(0, "0 (from the table) or more")) = 0.0  # 0: from gpt/runtime/hardware.py's table
out_json: Setting() = 'bench.json'
# -----------------------------------------------------------------------------
errors.install()
# the model's switches and Muon's settings, as train.py's; bench.py runs one process, so muon_shard does nothing
config = configurator.apply(globals(), sys.argv[1:], GPTConfig.settings(), {**muon.SETTINGS, 'muon_shard': replace(
    muon.SETTINGS['muon_shard'], unused=lambda c: c['optimizer'] == 'muon' and "bench.py runs one process")})
settings.check(config, config.declared)  # values that are the right type but make no sense: one line each
optim.check(optimizer, 'none')
listed = lambda sizes: [int(b) for b in sizes.split(',') if b.strip()]
if not listed(batch_sizes) and not listed(gen_batch_sizes):
    raise errors.UserError("batch_sizes and gen_batch_sizes are both empty, so there is nothing to benchmark: give "
                           "micro-batch sizes to time (--batch_sizes=12,32), generation batch sizes "
                           "(--gen_batch_sizes=1,10), or both")
# settings only one of the two benchmarks uses: a note when one is given and that benchmark's list is empty
ONLY = {('batch_sizes', "no training step is timed"): ('optimizer', 'learning_rate', 'weight_decay', 'grad_clip',
        'warmup_steps', 'timed_steps', 'fused_loss', 'cuda_graph', 'profile', 'peak_flops'),
        ('gen_batch_sizes', "generation is not timed"): ('gen_tokens', 'top_k')}
declared = {**config.declared, **{k: replace(config.declared[k], unused=lambda c, sizes=sizes, why=why: not listed(
    c[sizes]) and f"{sizes} is empty: {why}") for (sizes, why), names in ONLY.items() for k in names}}
for line in settings.notes(config, declared):
    print(f"note: {line}")
profile_path = lambda B: f"{os.path.splitext(out_json)[0]}_profile_B{B}.txt"


def real_tokens():
    """train.bin of data/<dataset> or data_dir (a sharded dataset's first shard), checked as train.py checks it."""
    folder, meta, hint = find_dataset(dataset, data_dir)
    if not (shards := list_shards(folder, 'train')):
        token_dtype = (meta or {}).get('dtype', 'uint16')
        return open_tokens(check_split(folder, 'train', block_size, vocab_size, token_dtype, hint), token_dtype)
    tokens = open_shard(shards[0])
    if len(tokens) < block_size + 1:
        raise errors.UserError(f"{shards[0]} has {len(tokens)} tokens, too few for block_size={block_size}")
    check_ids(tokens, vocab_size, shards[0])
    return tokens


# the results' files and the data are checked before the benchmark, not found wanting after it
check_output_file(out_json, "--out_json")
for B in listed(batch_sizes) if profile else []:
    check_output_file(profile_path(B), "--out_json's profile file")
data = real_tokens() if real_data else None
# -----------------------------------------------------------------------------

device = hardware.resolve_device(device)
device_type = device.split(':')[0]
dtype = hardware.resolve_dtype(dtype, device_type)
ctx = hardware.autocast(device_type, dtype)
torch.set_float32_matmul_precision('high')
hardware.attention_kernels(cudnn=cudnn_attention)
torch._functorch.config.activation_memory_budget = activation_memory_budget
cuda_graph = stepgraph.can_graph(cuda_graph, device_type, False, dtype, False)
model_config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                         bias=bias, dropout=dropout, **{k: config[k] for k in GPTConfig.settings()})
for k in ('fused_qk', 'fused_norm'):
    setattr(model_config, k, hardware.can_fuse(k, getattr(model_config, k), model_config, device_type, compile))
model_config.bf16_residual = hardware.can_bf16_residual(model_config.bf16_residual, dtype)
sync = torch.cuda.synchronize if device_type == 'cuda' else lambda: None


def batches(B):
    g = torch.Generator().manual_seed(seed)
    while True:
        if real_data:
            ix = torch.randint(len(data) - block_size, (B,), generator=g).tolist()
            xy = torch.from_numpy(np.stack([data[i:i + block_size + 1].astype(np.int64) for i in ix]))
        else:
            xy = torch.randint(0, vocab_size, (B, block_size + 1), generator=g)
        yield to_device(torch.device(device), xy[:, :-1], xy[:, 1:])  # pinned on CUDA, as train.py's loaders


def write_profile(B, step):
    """Where a step's GPU time goes: torch.profiler's table of kernels, largest total first."""
    kinds = torch.profiler.ProfilerActivity
    activities = [kinds.CPU] + ([kinds.CUDA] if device_type == 'cuda' else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step()
        sync()
    sort = 'self_cuda_time_total' if device_type == 'cuda' else 'self_cpu_time_total'  # kernels, not their callers
    path = profile_path(B)
    with atomic_write(path, 'w') as f:  # a link at the path is replaced, never written through
        f.write(prof.key_averages().table(sort_by=sort, row_limit=80, max_name_column_width=90))
    print(f"wrote {path} (3 steps)")


def check_fast_path(B):
    """The fast path (compiled, fused loss) against the plain one (eager, lm_head + F.cross_entropy) on the
    same weights and batch: the loss, and each parameter's gradient as a relative difference (bf16-sized)."""
    torch.manual_seed(seed)
    model = GPT(model_config).to(device)
    x, y = next(batches(B))
    out = []
    for fast in (False, True):
        model.config.fused_loss = fast
        step_model = hardware.maybe_compile(model, compile and fast, device_type)
        model.zero_grad(set_to_none=True)
        with ctx:
            _, loss = step_model(x, y)
        loss.backward()
        out.append((loss.item(), [p.grad.float() for p in model.parameters()]))
    (plain_loss, plain_grads), (fast_loss, fast_grads) = out
    diff = max(((f - p).norm() / p.norm()).item() for f, p in zip(fast_grads, plain_grads))
    return dict(plain_loss=plain_loss, fast_loss=fast_loss, max_grad_rel_diff=diff)


def bench_train(B):
    torch.manual_seed(seed)
    model = GPT(model_config).to(device)
    model.config.fused_loss = fused_loss
    chosen = dict(name=optimizer, learning_rate=learning_rate, weight_decay=weight_decay, betas=(0.9, 0.95),
                  **{k: config[k] for k in muon.SETTINGS})
    opt = optim.build(model, chosen, device_type)
    step_model = hardware.maybe_compile(model, compile, device_type)
    data = batches(B)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
    if cuda_graph:  # the same step, replayed from a graph
        graph = stepgraph.StepGraph(step_model, opt, ctx, grad_clip, 1, B, block_size, device, scaler=scaler)
        set_lr(opt, learning_rate)
        step = lambda: graph.run([next(data)])[0]
    else:  # train.py's step (gpt/training/step.py), one micro-step
        step = lambda: train_step(step_model, opt, scaler, [next(data)], 1, ctx, grad_clip)[0]
    if device_type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup_steps + timed_steps):
        if i == warmup_steps:
            sync()
            t0 = time.perf_counter()
        loss = step()
    lossf = loss.item()  # also a sync point
    sync()
    dt = (time.perf_counter() - t0) / timed_steps
    if profile:
        write_profile(B, step)
    mfu = model.estimate_mfu(B, dt, peak_flops or hardware.peak_flops(device))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device_type == 'cuda' else None
    return dict(batch_size=B, ms_per_step=dt * 1000, tokens_per_s=B * block_size / dt,
                mfu=mfu, peak_mem_gib=peak, final_loss=lossf)


def bench_generate(B):
    torch.manual_seed(seed)
    model = GPT(model_config).to(device).eval()
    gen_ctx = hardware.for_generation(model, device_type, dtype)  # bf16 weights on a GPU, as sample.py
    # compile as sample.py --compile=True does: the decode step, which the CUDA graph then replays
    compile_step = hardware.can_compile(compile, device_type)
    prompt = torch.randint(0, vocab_size, (B, 1), device=device)
    with gen_ctx:
        # a warm-up of the same shape (on CUDA it captures the decode step's graph, which is reused), then the timed run
        for _ in range(2):
            t0 = time.perf_counter()
            model.generate(prompt, gen_tokens, top_k=top_k or None, compile_step=compile_step)
            sync()
        dt = time.perf_counter() - t0
        # the cache (and the graph) must not change the result: greedy decoding with and without it
        greedy = model.generate(prompt, 128, temperature=0)
        plain = model.generate(prompt, 128, temperature=0, use_cache=False)
    return dict(batch_size=B, new_tokens=gen_tokens, seconds=dt, tokens_per_s=B * gen_tokens / dt,
                cuda_graph=generation.uses_graphs(model, device),
                greedy_matches_uncached=bool(torch.equal(greedy, plain)))


try:  # GIT_REVISION: for copies of the tree without .git
    git = os.environ.get('GIT_REVISION') or subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], text=True,
        capture_output=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
except OSError:
    git = None
card = torch.cuda.get_device_name(device) if device_type == 'cuda' else device_type
results = dict(card=card, torch=torch.__version__, git=git, config=config, train=[], generate=[])
if check_batch_size:
    results['fast_vs_plain'] = check_fast_path(check_batch_size)
    print("fast path vs plain path: " + ", ".join(f"{k} {v:.5g}" for k, v in results['fast_vs_plain'].items()))
for B in listed(batch_sizes):
    results['train'].append(r := bench_train(B))
    print(f"train B={B}: {r['ms_per_step']:.1f} ms/step, {r['tokens_per_s']:,.0f} tok/s", flush=True)
for B in listed(gen_batch_sizes):
    results['generate'].append(r := bench_generate(B))
    print(f"generate B={B}: {r['tokens_per_s']:,.0f} tok/s (CUDA graph: {r['cuda_graph']})", flush=True)
print(f"\n{card}, torch {torch.__version__}, dtype {dtype}, compile {compile}, fused_loss {fused_loss}, "
      f"cuda_graph {cuda_graph}, git {results['git']}")
if results['train']:
    print("| micro-batch | ms/step | tokens/s | MFU | peak memory |\n| --- | --- | --- | --- | --- |")
for r in results['train']:
    mfu = f"{r['mfu'] * 100:.1f}%" if r['mfu'] is not None else "n/a"
    mem = f"{r['peak_mem_gib']:.1f} GiB" if r['peak_mem_gib'] is not None else "n/a"
    print(f"| {r['batch_size']} | {r['ms_per_step']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | {mem} |")
if results['generate']:
    print("| generate batch | new tokens | tokens/s | CUDA graph | greedy == uncached |")
    print("| --- | --- | --- | --- | --- |")
    for r in results['generate']:
        print(f"| {r['batch_size']} | {r['new_tokens']} | {r['tokens_per_s']:,.0f} | {r['cuda_graph']} "
              f"| {r['greedy_matches_uncached']} |")
try:  # after the table, so that a write that fails anyway (a full disk) leaves the numbers on the screen
    with atomic_write(out_json, 'w') as f:
        json.dump(results, f, indent=1)
except OSError as e:
    raise errors.UserError(f"could not write {out_json} ({e.strerror or e}); the results are the table above")
print(f"wrote {out_json}")
