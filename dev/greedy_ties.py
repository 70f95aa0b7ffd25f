#!/usr/bin/env python3
"""
Why bench.py can print `greedy == uncached: False` at generation batch 10 (docs/benchmarks.md): bench.py's
random-weight GPT-2, greedy decoding with the KV cache against recomputing every sequence, in float32 and in
bfloat16 weights (bench.py and sample.py's on a GPU). For the first token where they part, the gap between
the two likeliest tokens' logits (recomputed in float64 from the shared prefix) against bf16's rounding.

    python dev/greedy_ties.py                      # CPU, bench.py's shape, batch 10, 64 tokens
    python dev/greedy_ties.py --device=cuda        # on the GPU, the very kernels bench.py uses
"""
import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402


def first_difference(a, b):
    """(sequence, position) of the first token where a and b differ, or None."""
    diff = (a != b).nonzero()
    return None if not len(diff) else min(diff.tolist(), key=lambda rc: (rc[1], rc[0]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--n_layer", type=int, default=12)
    a = p.parse_args(argv)
    torch.manual_seed(1337)  # bench.py's seed and shape: random weights, as its generation benchmark
    model = GPT(GPTConfig(block_size=1024, vocab_size=50304, n_layer=a.n_layer, n_head=12, n_embd=768,
                          bias=False, dropout=0.0)).to(a.device).eval()
    prompt = torch.randint(0, 50304, (a.batch, 1), device=a.device)
    reference = copy.deepcopy(model).double()
    for dtype in (torch.float32, torch.bfloat16):
        m = model.to(dtype)
        with torch.no_grad():
            cached = m.generate(prompt, a.tokens, temperature=0)
            plain = m.generate(prompt, a.tokens, temperature=0, use_cache=False)
        where = first_difference(cached, plain)
        print(f"{str(dtype):15} batch {a.batch}: greedy == uncached: {where is None}", end="")
        if where is None:
            print()
            continue
        row, col = where
        with torch.no_grad():
            logits = reference(cached[row:row + 1, :col])[0][0, -1]
        top2 = logits.topk(2)
        gap, size = (top2.values[0] - top2.values[1]).item(), top2.values[0].abs().item()
        ulp = 2.0 ** (torch.tensor(size).log2().floor().item() - 7)  # bf16 keeps 8 significant bits
        print(f"; first apart: sequence {row}, new token {col - 1}, cached {cached[row, col].item()} "
              f"against {plain[row, col].item()}; float64 top-2 logits {top2.values[0]:.4f} and "
              f"{top2.values[1]:.4f}: a gap of {gap:.4f}, {gap / ulp:.2f} bf16 steps at that size ({ulp:.4f})")
        agree = (cached == plain).float().mean().item()
        print(f"{'':15} tokens equal overall: {100 * agree:.1f}%")


if __name__ == "__main__":
    main()
