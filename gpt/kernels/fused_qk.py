"""The RMSNorm of each head's queries and keys (qk_norm) and their rotary embedding, in one Triton kernel each
way, for model.py's attention where fused_qk is on: each row (one head of one token) read once, normalised and
rotated in float32 registers, and written once (docs/speedrun.md says why and where it runs).

The math is model.py's: n = x * rsqrt(mean(x^2) + eps) (F.rms_norm without a gain), then each (first half,
second half) pair rotated by its position's angle as transformers' rotate_half does:
    y1 = n1 cos - n2 sin,   y2 = n2 cos + n1 sin
and its gradient: the rotation by minus the angle, then RMSNorm's backward, dx = r (dn - n mean(dn n)).
tests/test_fused_qk.py checks both against the plain path under Triton's interpreter, on the CPU. The module does
not import torch (the tensors' own methods allocate), so that gpt/kernels/ahead.py's compilers load it without
torch; its autograd binding, norm_and_rotate, is gpt/kernels/dispatch.py's.
"""
import triton
import triton.language as tl

ROWS = 64  # rows (one head of one token each) per program


@triton.jit
def _rows(pid, rows, H, T, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr):
    """This program's rows as (b, t, h) and the column offsets of a half-row, with their masks."""
    r = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    h = r % H
    t = (r // H) % T
    b = r // (H * T)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (r < rows)[:, None] & (cols < HALF)[None, :]
    return r, b, t, h, cols, mask


@triton.jit
def _forward(x_ptr, y_ptr, cos_ptr, sin_ptr, rows, H, T, sxb, sxt, sxh, eps,
             HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
             ROWS: tl.constexpr):
    r, b, t, h, cols, mask = _rows(tl.program_id(0), rows, H, T, HALF, BLOCK_HALF, ROWS)
    x_at = x_ptr + (b * sxb + t * sxt + h * sxh)[:, None] + cols[None, :]
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
        x1, x2 = x1 * inv[:, None], x2 * inv[:, None]
    if ROPE:  # cos and sin are (T, 2 * HALF), their two halves equal
        at = t[:, None] * (2 * HALF) + cols[None, :]
        c, s = tl.load(cos_ptr + at, mask=mask, other=0.0), tl.load(sin_ptr + at, mask=mask, other=0.0)
        x1, x2 = x1 * c - x2 * s, x2 * c + x1 * s
    y_at = y_ptr + r[:, None] * (2 * HALF) + cols[None, :]  # y is contiguous (B, T, H, 2 * HALF)
    tl.store(y_at, x1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_at + HALF, x2.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(x_ptr, g_ptr, dx_ptr, cos_ptr, sin_ptr, rows, H, T, sxb, sxt, sxh, sgb, sgt, sgh, eps,
              HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
              ROWS: tl.constexpr):
    r, b, t, h, cols, mask = _rows(tl.program_id(0), rows, H, T, HALF, BLOCK_HALF, ROWS)
    g_at = g_ptr + (b * sgb + t * sgt + h * sgh)[:, None] + cols[None, :]
    g1 = tl.load(g_at, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(g_at + HALF, mask=mask, other=0.0).to(tl.float32)
    if ROPE:  # the rotation's transpose: the rotation by minus the angle
        at = t[:, None] * (2 * HALF) + cols[None, :]
        c, s = tl.load(cos_ptr + at, mask=mask, other=0.0), tl.load(sin_ptr + at, mask=mask, other=0.0)
        g1, g2 = g1 * c + g2 * s, g2 * c - g1 * s
    if NORM:  # recompute the normalised row n from x, then dx = r (dn - n mean(dn n))
        x_at = x_ptr + (b * sxb + t * sxt + h * sxh)[:, None] + cols[None, :]
        x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
        n1, n2 = x1 * inv[:, None], x2 * inv[:, None]
        dot = (tl.sum(g1 * n1, 1) + tl.sum(g2 * n2, 1)) / (2 * HALF)
        g1, g2 = inv[:, None] * (g1 - n1 * dot[:, None]), inv[:, None] * (g2 - n2 * dot[:, None])
    dx_at = dx_ptr + r[:, None] * (2 * HALF) + cols[None, :]
    tl.store(dx_at, g1.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_at + HALF, g2.to(dx_ptr.dtype.element_ty), mask=mask)


def _launch(kernel, x, g, cos, sin, eps, rope):
    """Run the forward (g None) or backward kernel over x (B, T, H, D) (and g, of x's shape), any strides but
    the last dim's."""
    B, T, H, D = x.shape
    out = x.new_empty((B, T, H, D))
    rows = B * T * H
    if rows == 0:
        return out
    inputs = (x,) if g is None else (x, g)
    inputs = [t if t.stride(-1) == 1 else t.contiguous() for t in inputs]
    strides = [s for t in inputs for s in t.stride()[:3]]
    table = (cos, sin) if rope else (x, x)  # not read without the rotation
    kernel[(triton.cdiv(rows, ROWS),)](*inputs, out, *table, rows, H, T, *strides, eps if eps is not None else 0.0,
                                      HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2),
                                      NORM=eps is not None, ROPE=rope, ROWS=ROWS)
    return out
