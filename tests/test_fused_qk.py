"""gpt/kernels/fused_qk.py: the Triton kernel for qk_norm and the rotary embedding computes what model.py's plain path
computes, forward and backward. On the CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set
before the kernels are defined, so in a fresh process); Triton comes with torch's CUDA builds, and the test
skips where it is not installed. On a GPU the compiled kernels run inside the model (pytest -m cuda)."""
import pytest
import torch
from conftest import needs_triton, run_interpreted, same_bf16_training

from model import GPT, GPTConfig

# q and k as views of c_attn's output, as the model passes them; the plain path's result and gradients, then
# the kernel's. Shapes: grouped-query heads, a half-row that is not a power of two (6 of 12), one position
COMPARE = r"""
import torch, torch.nn.functional as F
from model import rotary, apply_rotary
from gpt.kernels.dispatch import norm_and_rotate
torch.manual_seed(0)
for (B, T, H, Hk, D), norm, rope in [((2, 5, 4, 2, 8), True, True), ((2, 5, 3, 3, 6), True, False),
                                     ((1, 7, 2, 2, 12), False, True), ((3, 1, 2, 1, 4), True, True)]:
    qkv = (3 * torch.randn(B, T, (H + 2 * Hk) * D)).requires_grad_()
    table = rotary(torch.arange(T) + 3, D, 10000.0) if rope else None

    def plain():
        q, k, _ = qkv.split([H * D, Hk * D, Hk * D], -1)
        q, k = q.view(B, T, H, D).transpose(1, 2), k.view(B, T, Hk, D).transpose(1, 2)
        if norm:
            q, k = F.rms_norm(q, (D,), eps=1e-5), F.rms_norm(k, (D,), eps=1e-5)
        if rope:
            q, k = apply_rotary(q, *table), apply_rotary(k, *table)
        return q, k

    def fused():
        q, k, _ = qkv.split([H * D, Hk * D, Hk * D], -1)
        q, k = norm_and_rotate(q.view(B, T, H, D), k.view(B, T, Hk, D), table, 1e-5 if norm else None)
        return q.transpose(1, 2), k.transpose(1, 2)

    gq, gk = torch.randn(B, H, T, D), torch.randn(B, Hk, T, D)
    results = []
    for f in (plain, fused):
        qkv.grad = None
        q, k = f()
        ((q * gq).sum() + (k * gk).sum()).backward()
        results.append((q.detach(), k.detach(), qkv.grad.clone()))
    for name, a, b in zip(("q", "k", "grad"), *results):
        err = (a - b).abs().max().item()
        assert err < 1e-5, (B, T, H, Hk, D, norm, rope, name, err)
        assert a.abs().max() > 0.1  # something was computed
print("ok")
"""


@needs_triton
def test_kernel_computes_the_plain_paths_values_and_gradients():
    run_interpreted(COMPARE)


def test_the_plan_keeps_fused_qk_only_where_it_runs(capsys):
    from gpt.runtime import hardware
    rope = GPTConfig(n_layer=2, n_head=2, n_embd=32, pos_emb='rope')
    plain = GPTConfig(n_layer=2, n_head=2, n_embd=32)
    assert not hardware.can_fuse('fused_qk', True, rope, 'cpu', compiled=False)
    assert "fused_qk: off (needs a CUDA GPU (this run: cpu))" in capsys.readouterr().out
    assert not hardware.can_fuse('fused_qk', True, rope, 'cuda', compiled=True)
    assert "compile=True fuses them itself" in capsys.readouterr().out
    assert not hardware.can_fuse('fused_qk', True, plain, 'cuda', compiled=False)
    assert "neither qk_norm nor rotary" in capsys.readouterr().out
    assert not hardware.can_fuse('fused_qk', False, rope, 'cuda', compiled=False)
    assert capsys.readouterr().out == ""


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_model_with_fused_qk_trains_as_the_plain_one_on_a_gpu(family):
    """bf16 autocast, as training runs: the same loss and gradients to bf16 rounding."""
    switches = dict(qk_norm=True, pos_emb='rope') if family == 'gpt2' else dict(family='llama', n_kv_head=2)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=256, bias=False,
                          **switches)).cuda()
    x = torch.randint(0, 256, (4, 64), device='cuda')
    y = torch.randint(0, 256, (4, 64), device='cuda')
    same_bf16_training(model, x, y, 'fused_qk')
