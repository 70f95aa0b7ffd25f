#!/usr/bin/env python3
"""
What FP8 matmuls could save a training step, at most: the step's head and MLP matmuls (forward and both
backward products) timed in bf16 (torch.mm) and in FP8 (torch._scaled_mm, per-tensor scales), the FP8 time
with and without quantizing its operands (amax, scale, cast: what a real FP8 layer pays on every call). The
shapes are GPT-2 124M's at --tokens a step (the speedrun recipe: 16 x 1024). Needs an H100 or newer; prints
a markdown table (docs/records/2026-11-27-speedrun.md).

    python dev/fp8_matmul.py [--tokens=16384] [--n_layer=12]
"""
import argparse
import sys

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantize(x, dtype):
    """x as dtype with a per-tensor scale (x ~ q * scale), the scale from x's largest magnitude."""
    scale = (x.abs().amax().float() / torch.finfo(dtype).max).clamp(min=1e-12)
    return (x / scale).to(dtype), scale


def timed(fn, iters):
    """Median milliseconds of fn over iters calls, after warming up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def products(M, K, N):
    """A linear layer's three matmuls, (a rows x inner, inner x b cols) and the dtypes FP8 gives them:
    forward x @ W.T, grad_x = grad @ W, grad_W = grad.T @ x (gradients in e5m2, the rest in e4m3)."""
    return [("forward", (M, K, N), E4M3, E4M3), ("grad input", (M, N, K), E5M2, E4M3),
            ("grad weight", (N, M, K), E5M2, E4M3)]


def measure(rows, inner, cols, a_type, b_type, iters):
    a = torch.randn(rows, inner, device="cuda", dtype=torch.bfloat16)
    # row-major (cols, inner), so that b.t() is the column-major operand _scaled_mm wants
    b = torch.randn(cols, inner, device="cuda", dtype=torch.bfloat16)
    bf16 = timed(lambda: a @ b.t(), iters)
    qa, sa = quantize(a, a_type)
    qb, sb = quantize(b, b_type)
    fp8 = timed(lambda: torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), iters)

    def with_casts():
        qa, sa = quantize(a, a_type)
        qb, sb = quantize(b, b_type)
        return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    both = timed(with_casts, iters)
    ref, out = (a @ b.t()).float(), with_casts().float()
    error = ((out - ref).norm() / ref.norm()).item()
    return bf16, fp8, both, error


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=16 * 1024, help="tokens a step (batch x block_size)")
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--vocab_size", type=int, default=50304)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        sys.exit("error: FP8 matmuls need a CUDA GPU of compute capability 8.9 or newer (H100, L4, ...): run "
                 "this on one")
    M, C = args.tokens, args.n_embd
    layers = [("head", 1, (M, C, args.vocab_size)), ("MLP in", args.n_layer, (M, C, 4 * C)),
              ("MLP out", args.n_layer, (M, 4 * C, C))]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {M:,} tokens a step; ms a step "
          f"(times the layer count)\n")
    print("| layer | product | bf16 | fp8 | fp8 with its casts | relative error |")
    print("| --- | --- | --- | --- | --- | --- |")
    totals = [0.0, 0.0, 0.0]
    for name, count, (m, k, n) in layers:
        for product, shape, a_type, b_type in products(m, k, n):
            bf16, fp8, both, error = measure(*shape, a_type, b_type, args.iters)
            for i, t in enumerate((bf16, fp8, both)):
                totals[i] += count * t
            print(f"| {name} x{count} | {product} {shape} | {count * bf16:.2f} | {count * fp8:.2f} | "
                  f"{count * both:.2f} | {error:.3f} |")
    print(f"| all | | {totals[0]:.2f} | {totals[1]:.2f} | {totals[2]:.2f} | |")
    saved, cast = totals[0] - totals[1], totals[0] - totals[2]
    print(f"\nFP8 on operands already cast: {saved:.2f} ms a step less than bf16; with its casts: "
          + (f"{cast:.2f} ms less" if cast >= 0 else f"{-cast:.2f} ms more"))


if __name__ == "__main__":
    main()
