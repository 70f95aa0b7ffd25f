"""LayerNorm forward and backward as Triton kernels, for model.py's LayerNorm where fused_norm is on. Uncompiled,
torch's backward sums the weight's and bias's gradients over the rows in a slow kernel of its own
(GammaBetaBackward); here each program sums its rows' share as it computes the input's gradient, and one small sum
over the programs finishes them. The forward normalises a block of rows in float32 registers.

The math is F.layer_norm's, in float32: n = (x - mean) rstd, rstd = 1 / sqrt(var + eps), y = n w + b; backward
dn = dy w, dx = rstd (dn - mean(dn) - n mean(dn n)), dw = sum(dy n), db = sum(dy) over the rows.
tests/test_layer_norm.py checks both against F.layer_norm under Triton's interpreter, on the CPU. As fused_qk.py,
the module imports torch only in its launches; the autograd binding, layer_norm, is gpt/kernels/dispatch.py's.
"""
import triton
import triton.language as tl

TILE = 4096  # elements of the rows a program holds at once
PROGRAMS = 512  # backward: about this many programs or fewer, each summing its rows' share of dw and db


@triton.jit
def _forward(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, HAS_BIAS: tl.constexpr,
             BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    at = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, 1) / N + eps)
    y = xc * rstd[:, None] * tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rows < M)
    tl.store(rstd_ptr + rows, rstd, mask=rows < M)


@triton.jit
def _backward(x_ptr, w_ptr, dy_ptr, dx_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, M, N,
              BLOCK_N: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr):
    """dx for TILES x ROWS rows; this program's sums of dy n and dy go to row pid of dw and db (programs, N)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    dw, db = tl.zeros([BLOCK_N], tl.float32), tl.zeros([BLOCK_N], tl.float32)
    for tile in range(TILES):
        rows = (pid.to(tl.int64) * TILES + tile) * ROWS + tl.arange(0, ROWS)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        at = rows[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + at, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        n = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        dn = dy * w[None, :]
        dx = rstd[:, None] * (dn - (tl.sum(dn, 1) / N)[:, None] - n * (tl.sum(dn * n, 1) / N)[:, None])
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * n, 0)
        db += tl.sum(dy, 0)
    tl.store(dw_ptr + pid * N + cols, dw, mask=cols < N)
    tl.store(db_ptr + pid * N + cols, db, mask=cols < N)


def _shape(N):
    """The block of columns, and the rows a program holds at once, for rows of N."""
    block = triton.next_power_of_2(N)
    return block, max(1, TILE // block)


def forward(x, weight, bias, eps):
    """y (x's dtype), mean and rstd (float32, one per row) for x (M, N), contiguous; bias may be None."""
    import torch
    (M, N), (block, rows) = x.shape, _shape(x.shape[1])
    y, mean, rstd = x.new_empty((M, N)), x.new_empty(M, dtype=torch.float32), x.new_empty(M, dtype=torch.float32)
    if M:
        _forward[(triton.cdiv(M, rows),)](x, weight, weight if bias is None else bias, y, mean, rstd, M, N, eps,
                                         HAS_BIAS=bias is not None, BLOCK_N=block, ROWS=rows)
    return y, mean, rstd


def backward(x, weight, dy, mean, rstd):
    """dx (x's dtype), and each program's share of dw and db (programs, N) float32, to be summed over dim 0."""
    import torch
    (M, N), (block, rows) = x.shape, _shape(x.shape[1])
    tiles = triton.next_power_of_2(triton.cdiv(M, rows * PROGRAMS))  # a power of two: few variants
    programs = triton.cdiv(M, rows * tiles)
    dx, dw, db = x.new_empty((M, N)), *(x.new_empty((programs, N), dtype=torch.float32) for _ in range(2))
    if M:
        _backward[(programs,)](x, weight, dy, dx, mean, rstd, dw, db, M, N, BLOCK_N=block, ROWS=rows, TILES=tiles)
    return dx, dw, db
