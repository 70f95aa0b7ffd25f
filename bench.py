"""
Benchmark the training step and generation, nanoGPT's bench.py grown up: for each micro-batch size,
ms per step, tokens/s, MFU against the card's peak and peak memory; then generation speed with the KV
cache. Prints a table and writes the numbers, the card, torch and the git revision to a JSON file.
$ python bench.py                                   # GPT-2 124M, B=12 and 32, synthetic tokens
$ python bench.py --batch_sizes=12,32,64 --compile=False --gen_batch_sizes=1,10
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

import configurator
import errors
import hardware
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
batch_sizes = '12,32'  # micro-batch sizes to time, comma separated
block_size = 1024
n_layer = 12
n_head = 12
n_embd = 768
vocab_size = 50304
bias = False
dropout = 0.0
real_data = False  # True: windows of data/<dataset>/train.bin; False: random tokens
dataset = 'openwebtext'
learning_rate = 6e-4
weight_decay = 1e-1
grad_clip = 1.0
warmup_steps = 10  # untimed steps (compilation, allocator warm-up)
timed_steps = 30
gen_batch_sizes = '1,10'  # generation benchmark batch sizes ('' to skip)
gen_tokens = 500
top_k = 200
seed = 1337
device = 'auto'
dtype = 'auto'
compile = True
peak_flops = 0.0  # 0: from hardware.py's table
out_json = 'bench.json'
# -----------------------------------------------------------------------------
errors.install()
config = configurator.apply(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------

device = hardware.resolve_device(device)
device_type = device.split(':')[0]
dtype = hardware.resolve_dtype(dtype, device_type)
ctx = hardware.autocast(device_type, dtype)
torch.set_float32_matmul_precision('high')
model_config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                         n_embd=n_embd, bias=bias, dropout=dropout)


def sync():
    if device_type == 'cuda':
        torch.cuda.synchronize()


def batches(B):
    """An endless supply of (x, y) batches, real or random, already on the device."""
    g = torch.Generator().manual_seed(seed)
    if real_data:
        data = np.memmap(os.path.join('data', dataset, 'train.bin'), dtype=np.uint16, mode='r')
    while True:
        if real_data:
            ix = torch.randint(len(data) - block_size, (B,), generator=g).tolist()
            xy = torch.from_numpy(np.stack([data[i:i + block_size + 1].astype(np.int64) for i in ix]))
        else:
            xy = torch.randint(0, vocab_size, (B, block_size + 1), generator=g)
        xy = xy.to(device)
        yield xy[:, :-1], xy[:, 1:]


def bench_train(B):
    torch.manual_seed(seed)
    model = GPT(model_config).to(device)
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (0.9, 0.95), device_type)
    step_model = hardware.maybe_compile(model, compile, device_type)
    data = batches(B)
    if device_type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup_steps + timed_steps):
        if i == warmup_steps:
            sync()
            t0 = time.perf_counter()
        x, y = next(data)
        with ctx:
            _, loss = step_model(x, y)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    lossf = loss.item()  # also a sync point
    sync()
    dt = (time.perf_counter() - t0) / timed_steps
    mfu = model.estimate_mfu(B, dt, peak_flops or None)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device_type == 'cuda' else None
    del model, optimizer, step_model
    return dict(batch_size=B, ms_per_step=dt * 1000, tokens_per_s=B * block_size / dt,
                mfu=mfu, peak_mem_gib=peak, final_loss=lossf)


def bench_generate(B):
    torch.manual_seed(seed)
    model = GPT(model_config).to(device).eval()
    prompt = torch.randint(0, vocab_size, (B, 1), device=device)
    with ctx:
        model.generate(prompt, 20, top_k=top_k)  # warm-up
        sync()
        t0 = time.perf_counter()
        model.generate(prompt, gen_tokens, top_k=top_k)
        sync()
        dt = time.perf_counter() - t0
        # the cache must not change the result: greedy decoding with and without it
        greedy = model.generate(prompt, 64, temperature=0)
        plain = model.generate(prompt, 64, temperature=0, use_cache=False)
    del model
    return dict(batch_size=B, new_tokens=gen_tokens, seconds=dt, tokens_per_s=B * gen_tokens / dt,
                greedy_matches_uncached=bool(torch.equal(greedy, plain)))


def git_revision():
    if os.environ.get('GIT_REVISION'):  # for copies of the tree without .git
        return os.environ['GIT_REVISION']
    try:
        return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        return None


card = torch.cuda.get_device_name(device) if device_type == 'cuda' else device_type
results = dict(card=card, torch=torch.__version__, git=git_revision(), config=config, train=[], generate=[])
for B in [int(b) for b in batch_sizes.split(',') if b]:
    r = bench_train(B)
    results['train'].append(r)
    print(f"train B={B}: {r['ms_per_step']:.1f} ms/step, {r['tokens_per_s']:,.0f} tok/s", flush=True)
for B in [int(b) for b in gen_batch_sizes.split(',') if b]:
    r = bench_generate(B)
    results['generate'].append(r)
    print(f"generate B={B}: {r['tokens_per_s']:,.0f} tok/s", flush=True)
with open(out_json, 'w') as f:
    json.dump(results, f, indent=1)

print(f"\n{card}, torch {torch.__version__}, dtype {dtype}, compile {compile}, git {results['git']}")
print("| micro-batch | ms/step | tokens/s | MFU | peak memory |")
print("| --- | --- | --- | --- | --- |")
for r in results['train']:
    mfu = f"{r['mfu'] * 100:.1f}%" if r['mfu'] is not None else "n/a"
    mem = f"{r['peak_mem_gib']:.1f} GiB" if r['peak_mem_gib'] is not None else "n/a"
    print(f"| {r['batch_size']} | {r['ms_per_step']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | {mem} |")
if results['generate']:
    print("| generate batch | new tokens | tokens/s | greedy == uncached |")
    print("| --- | --- | --- | --- |")
    for r in results['generate']:
        print(f"| {r['batch_size']} | {r['new_tokens']} | {r['tokens_per_s']:,.0f} | {r['greedy_matches_uncached']} |")
print(f"wrote {out_json}")
