"""The cross-entropy's loss and its gradient from a chunk of logits, in one Triton kernel, for the fused loss's
LinearCrossEntropy (gpt/kernels/loss.py) on a CUDA GPU, uncompiled: each row read twice (its log-sum-exp, then
its gradient) and its gradient written once over the logits, which nothing needs after the loss, where the plain
path makes several float32 passes (docs/records/2026-11-27-speedrun.md#flash-attention-and-the-loss-kernel).

The math is F.cross_entropy's, in float32: lse = log(sum(exp(z))), loss = lse - z[target], and
d loss / d z = softmax(z) - one_hot(target); rows whose target is -1 are ignored (loss 0, gradient 0). With
logit soft-capping (cap > 0) z is first cap * tanh(z / cap), and the gradient is times its derivative,
1 - tanh^2. tests/test_cross_entropy.py checks it against torch's float64 under Triton's interpreter, on the CPU.
"""
import triton
import triton.language as tl

BLOCK = 4096  # logits of a row read at a time


@triton.jit
def _capped(z, cap, SOFTCAP: tl.constexpr):
    """z, soft-capped where SOFTCAP, and tanh(z / cap) (for the gradient; 0 without the cap)."""
    if SOFTCAP:
        th = 2 * tl.sigmoid(2 * z / cap) - 1  # tanh, from what Triton's interpreter has too
        return cap * th, th
    return z, z * 0


@triton.jit
def _loss_and_grad(z_ptr, stride, t_ptr, loss_ptr, cap, V: tl.constexpr, BLOCK: tl.constexpr, SOFTCAP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * stride
    target = tl.load(t_ptr + row).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # pass 1: the row's log-sum-exp, with a running maximum (every block has at least one logit)
    m, s = tl.zeros([], tl.float32) - float('inf'), tl.zeros([], tl.float32)
    for start in range(0, V, BLOCK):
        at = start + cols
        z, _ = _capped(tl.load(z_row + at, mask=at < V, other=0.0).to(tl.float32), cap, SOFTCAP)
        z = tl.where(at < V, z, float('-inf'))
        m_new = tl.maximum(m, tl.max(z, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    zt, _ = _capped(tl.load(z_row + tl.maximum(target, 0)).to(tl.float32), cap, SOFTCAP)
    tl.store(loss_ptr + row, tl.where(target >= 0, lse - zt, 0.0))
    # pass 2: the gradient, over the logits (each element is read before it is written, by this program only)
    keep = tl.where(target >= 0, 1.0, 0.0)
    for start in range(0, V, BLOCK):
        at = start + cols
        z, th = _capped(tl.load(z_row + at, mask=at < V, other=0.0).to(tl.float32), cap, SOFTCAP)
        g = tl.exp(z - lse) - tl.where(at == target, 1.0, 0.0)
        if SOFTCAP:
            g = g * (1 - th * th)
        tl.store(z_row + at, (g * keep).to(z_ptr.dtype.element_ty), mask=at < V)


def loss_and_grad_(logits, targets, softcap=0.0):
    """The loss of each row of logits (N, V) (float32, 0 where the target is -1), and, in place of the logits,
    d (sum of the losses) / d logits in their dtype. targets: (N,) int ids, -1 for none."""
    N, V = logits.shape
    if logits.stride(1) != 1 or not targets.is_contiguous():
        raise ValueError("loss_and_grad_ needs logits with dense rows and contiguous targets")
    import torch  # here, not at the top: gpt/kernels/ahead.py's compilers load this module without torch
    losses = torch.empty(N, dtype=torch.float32, device=logits.device)
    if N:
        _loss_and_grad[(N,)](logits, logits.stride(0), targets, losses, float(softcap), V=V,  # one compile a vocabulary
                             BLOCK=min(BLOCK, triton.next_power_of_2(V)), SOFTCAP=bool(softcap), num_warps=8)
    return losses
