"""
GPU check of fast generation (generation.py). Greedy decoding through the CUDA graph must give the tokens of
the uncached path: GPT-2 124M and a llama-style model with grouped-query attention, one-token and longer
prompts, and a run past block_size. Then tokens/s for 500 new tokens (top_k 200) at batch 1 and 10,
with the graph and with the same step run eagerly, and how many times a timed run waited on the GPU
(it should never). Random weights in bf16, as bench.py. Exit status 1 if a check fails.
Where greedy outputs differ it prints the first position that does, and by how much the uncached path's
best logit led its second there: a lead within bf16 rounding is a near-tie, not a wrong cache.
$ python dev/check_generation.py                      # bf16, random weights
$ python dev/check_generation.py --dtype=float32      # float32 weights, TF32 off: the logic alone
$ python dev/check_generation.py --ckpt=out-shakespeare-char   # trained weights: greedy checks only
"""
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import configurator  # noqa: E402
from gpt.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from gpt.runtime import hardware  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

dtype = "auto"  # or float32 (TF32 off too)
ckpt = ""  # an out_dir: check greedy decoding of its trained model
configurator.apply(globals(), sys.argv[1:])
new_tokens, top_k, batch_sizes = 500, 200, (1, 10)
device, dtype = "cuda", hardware.resolve_dtype(dtype, "cuda")
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
MODELS = {
    "gpt2-124M": dict(),  # GPTConfig's defaults are GPT-2 124M
    "llama-gqa": dict(family="llama", n_kv_head=4, vocab_size=32000, bias=False, tie_embeddings=False),
}


def build(**kw):
    torch.manual_seed(1337)
    model = GPT(GPTConfig(**kw)).to(device).eval()
    return model, hardware.for_generation(model, device, dtype)  # bf16 weights, no autocast


def first_difference(model, ctx, fast, plain, prompt_len):
    """Where greedy outputs part: the first such position, and the uncached path's lead of its chosen
    token over the runner-up there (in logits)."""
    rows, cols = (fast != plain).nonzero(as_tuple=True)
    pos = int(cols.min())
    row = int(rows[cols == pos][0])
    with ctx, torch.no_grad():
        logits = model(plain[row:row + 1, :pos])[0][0, -1].float()
    top2 = logits.topk(2).values
    return pos - prompt_len, float(top2[0] - top2[1])


def greedy_matches(name, model, ctx, B, prompt_len, n):
    prompt = torch.randint(0, model.config.vocab_size, (B, prompt_len), device=device)
    with ctx:
        fast = model.generate(prompt, n, temperature=0)
        plain = model.generate(prompt, n, temperature=0, use_cache=False)
    ok = torch.equal(fast, plain)
    where = ""
    if not ok:
        token, lead = first_difference(model, ctx, fast, plain, prompt_len)
        where = f"; first differs at new token {token}, where the uncached path's top logit led by {lead:.4f}"
    print(f"greedy == uncached: {ok}  ({name}, {dtype}, batch {B}, prompt {prompt_len}, {n} new tokens, "
          f"block_size {model.config.block_size}{where})", flush=True)
    return ok


def tokens_per_s(model, ctx, B, graphs):
    """tok/s of a timed run after a warm-up of the same shape (which captures the graph), and the number of
    times the timed run made the CPU wait for the GPU (torch's sync debug mode)."""
    prompt = torch.randint(0, model.config.vocab_size, (B, 1), device=device)
    with ctx:
        model.generate(prompt, new_tokens, top_k=top_k, cuda_graphs=graphs)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as syncs:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            model.generate(prompt, new_tokens, top_k=top_k, cuda_graphs=graphs)
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    return B * new_tokens / dt, len(syncs)


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype} weights", flush=True)
ok = True
rows = []
if ckpt:  # trained weights: greedy from prompts of the first characters/tokens of the vocabulary
    model = model_from_checkpoint(load_checkpoint(os.path.join(ckpt, "ckpt.pt"))).to(device).eval()
    ctx = hardware.for_generation(model, device, dtype)
    n = min(500, model.config.block_size - 8)
    for B, prompt_len in [(1, 1), (10, 1), (10, 8)]:
        ok &= greedy_matches(ckpt, model, ctx, B, prompt_len, n)
    MODELS = {}
for name, kw in MODELS.items():
    model, ctx = build(**kw)
    for B, prompt_len in [(1, 1), (10, 1), (10, 100)]:
        ok &= greedy_matches(name, model, ctx, B, prompt_len, 128)
    for B in batch_sizes if dtype != "float32" else []:  # float32 checks the logic, not the speed
        graph, syncs = tokens_per_s(model, ctx, B, graphs=True)
        eager, _ = tokens_per_s(model, ctx, B, graphs=False)
        rows.append((name, B, graph, eager, syncs))
        print(f"{name} batch {B}: {graph:,.0f} tok/s with the CUDA graph ({syncs} syncs), {eager:,.0f} eager",
              flush=True)
    del model
    small, ctx = build(**kw, block_size=128)  # 100 + 64 tokens: past block_size, then cropped and recomputed
    ok &= greedy_matches(name, small, ctx, 3, 100, 64)
    del small

print("\n| model | batch | new tokens | tok/s, CUDA graph | tok/s, eager step | syncs |")
print("| --- | --- | --- | --- | --- | --- |")
for name, B, graph, eager, syncs in rows:
    print(f"| {name} | {B} | {new_tokens} | {graph:,.0f} | {eager:,.0f} | {syncs} |")
print("all greedy checks passed" if ok else "A GREEDY CHECK FAILED")
sys.exit(0 if ok else 1)
