"""gpt/kernels/cross_entropy.py: the Triton kernel behind fused_loss on a GPU computes F.cross_entropy's loss and its
gradient. On the CPU the kernel runs under Triton's interpreter (TRITON_INTERPRET=1, set before the kernel is
defined, so in a fresh process); Triton comes with torch's CUDA builds, and the test skips where it is not
installed. On a GPU the compiled kernel runs inside the model's fused loss (pytest -m cuda), against the plain
path."""
import pytest
import torch
from conftest import needs_triton, run_interpreted, same_bf16_training

from model import GPT, GPTConfig

# against float64 torch: rows wider than one block (5000 > 4096) and narrower (37), ignored targets, a target
# in the last partial block, soft-capping, bf16 logits (the kernel computes in float32, writes bf16)
COMPARE = r"""
import torch, torch.nn.functional as F
from gpt.kernels.cross_entropy import loss_and_grad_
torch.manual_seed(0)
for N, V, cap, dtype in [(6, 5000, 0.0, torch.float32), (5, 37, 0.0, torch.float32), (4, 5000, 15.0, torch.float32),
                         (3, 300, 0.0, torch.bfloat16)]:
    logits = (4 * torch.randn(N, V)).to(dtype).float()  # the values the kernel reads
    targets = torch.randint(0, V, (N,))
    targets[1], targets[2] = -1, V - 1
    z = logits.double().requires_grad_()
    capped = cap * torch.tanh(z / cap) if cap else z
    want = F.cross_entropy(capped, targets, ignore_index=-1, reduction='none')
    want.sum().backward()
    got = logits.to(dtype)
    losses = loss_and_grad_(got, targets, cap)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert losses.dtype == torch.float32 and losses[1] == 0, losses
    assert torch.allclose(losses.double(), want.detach(), atol=1e-4, rtol=1e-5), (N, V, cap, losses, want)
    assert torch.allclose(got.double(), z.grad, atol=tol), (N, V, cap, (got.double() - z.grad).abs().max())
    assert got[1].abs().max() == 0 and z.grad.abs().max() > 0.1  # ignored row: no gradient; others: some
print("ok")
"""


@needs_triton
def test_kernel_computes_cross_entropys_loss_and_gradient():
    run_interpreted(COMPARE)


@pytest.mark.cuda
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_the_fused_loss_on_a_gpu_trains_as_the_plain_loss(softcap):
    """bf16 autocast, as training runs, chunks that do not divide the positions: the same loss and gradients as
    lm_head + F.cross_entropy, to bf16 rounding, with ignored targets."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=128, block_size=64, vocab_size=5000, bias=False,
                          logit_softcap=softcap, loss_chunk=100)).cuda()
    x = torch.randint(0, 5000, (4, 64), device='cuda')
    y = torch.randint(0, 5000, (4, 64), device='cuda')
    y[0, :10] = -1
    same_bf16_training(model, x, y, 'fused_loss')
