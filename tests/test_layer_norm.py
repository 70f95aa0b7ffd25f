"""gpt/kernels/layer_norm.py: LayerNorm's Triton kernels compute what F.layer_norm computes, the input's gradient and
the weight's and bias's, on the CPU under Triton's interpreter (a fresh process, as tests/test_fused_qk.py's); on a
GPU, a model with fused_norm trains as the plain one (pytest -m cuda). And the plan keeps fused_norm only where
it runs."""
import pytest
import torch
from conftest import needs_triton, run_interpreted, same_bf16_training

from model import GPT, GPTConfig

# rows that fill a program's block or not, widths that are not powers of two, with and without a bias; few programs
# (PROGRAMS = 2), so that a backward program sums several tiles of rows
COMPARE = r"""
import torch, torch.nn.functional as F
from gpt.kernels import dispatch, layer_norm
torch.manual_seed(0)
for programs in (512, 2):
    layer_norm.PROGRAMS = programs
    for shape, N, bias in [((2, 5), 48, True), ((3, 7), 100, False), ((1, 1), 8, True), ((4, 130), 32, True)]:
        x = (3 * torch.randn(*shape, N) + 1).requires_grad_()
        w = (1 + torch.randn(N) / 4).requires_grad_()
        b = torch.randn(N, requires_grad=True) if bias else None
        g = torch.randn(*shape, N)
        results = []
        for f in (F.layer_norm, lambda x, n, w, b, eps: dispatch.layer_norm(x, w, b, eps)):
            for t in (x, w, b):
                if t is not None:
                    t.grad = None
            y = f(x, (N,), w, b, 1e-5)
            (y * g).sum().backward()
            results.append([y.detach(), x.grad, w.grad] + ([b.grad] if bias else []))
        for name, a, c in zip(("y", "dx", "dw", "db"), *results):
            err = (a - c).abs().max().item()
            assert err < 2e-5 * max(1, a.abs().max().item()), (programs, shape, N, bias, name, err)
            assert a.abs().max() > 0.1  # something was computed
print("ok")
"""


@needs_triton
def test_kernels_compute_layer_norms_values_and_gradients():
    run_interpreted(COMPARE)


def test_the_plan_keeps_fused_norm_only_where_it_runs(capsys):
    from gpt.runtime import hardware
    gpt2, llama = GPTConfig(n_layer=2, n_head=2, n_embd=32), GPTConfig(n_layer=2, n_head=2, n_embd=32, family='llama')
    assert not hardware.can_fuse('fused_norm', True, llama, 'cuda', compiled=False)
    assert "fused_norm: off (llama's norms are RMSNorm, not LayerNorm)" in capsys.readouterr().out
    assert not hardware.can_fuse('fused_norm', True, gpt2, 'cpu', compiled=False)
    assert "fused_norm: off (needs a CUDA GPU (this run: cpu))" in capsys.readouterr().out
    assert not hardware.can_fuse('fused_norm', True, gpt2, 'cuda', compiled=True)
    assert "compile=True fuses them itself" in capsys.readouterr().out
    assert not hardware.can_fuse('fused_norm', False, gpt2, 'cuda', compiled=False)
    assert capsys.readouterr().out == ""


@pytest.mark.cuda
@pytest.mark.parametrize("bias,bf16_residual", [(True, False), (False, True)])
def test_a_model_with_fused_norm_trains_as_the_plain_one_on_a_gpu(bias, bf16_residual):
    """bf16 autocast, as training runs: the same loss and gradients to bf16 rounding, the stream in float32
    (shakespeare_char's) or bf16 (the speedrun's)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=256, bias=bias,
                          bf16_residual=bf16_residual)).cuda()
    x = torch.randint(0, 256, (4, 64), device='cuda')
    y = torch.randint(0, 256, (4, 64), device='cuda')
    same_bf16_training(model, x, y, 'fused_norm')
