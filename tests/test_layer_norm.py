"""gpt/kernels/layer_norm.py: LayerNorm's Triton kernels compute what F.layer_norm computes, the input's gradient and
the weight's and bias's, and a model trains with them as without, on the CPU under Triton's interpreter (a fresh
process, as tests/test_fused_qk.py's); on a GPU, a bf16 model's step with fused_norm is the plain one's (pytest -m
cuda). And the plan keeps fused_norm only where it runs."""
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


# a model trained 30 steps with the kernels (run on the CPU here) and without, the same seed and batches: float32
# on the CPU is deterministic, so any difference is the kernels' own
TRAINING = r"""
import torch
from gpt.kernels import dispatch
from model import GPT, GPTConfig
dispatch.runs_on = lambda x: True
data = (torch.arange(20000) * 7 + torch.arange(20000) // 13) % 65  # a pattern the model learns
losses = []
for fused in (False, True):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=48, block_size=32, vocab_size=65, bias=True, fused_norm=fused))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses.append([])
    for step in range(30):
        ix = torch.randint(0, len(data) - 33, (8,), generator=g)
        x, y = (torch.stack([data[i + k:i + k + 32] for i in ix]) for k in (0, 1))
        loss = model(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[-1].append(loss.item())
plain, fused = losses
assert plain[-1] < plain[0] - 2, plain  # it trained
assert max(abs(a - b) for a, b in zip(plain, fused)) < 1e-5, (plain, fused)
print("ok")
"""


@needs_triton
def test_a_model_trains_with_the_kernels_as_without_them():
    run_interpreted(TRAINING)


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


@pytest.mark.cuda
@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_fused_norms_gradients_are_as_close_to_float64_as_torchs(autocast):
    """An error that leans one way, however small, shows as a worse loss late in training, where the noise of the
    steps no longer hides it: each parameter's gradient with the kernels must be as near a float64 reference's as
    torch's own LayerNorm's is (shakespeare_char's shape; gains away from 1, as in a trained model)."""
    import copy
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=6, n_embd=384, block_size=256, vocab_size=65, dropout=0.0)).cuda()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if '.ln_' in name:
                p.mul_(1 + torch.randn_like(p) / 3)
    x, y = (torch.randint(0, 65, (16, 256), device='cuda') for _ in range(2))

    def grads_of(m, fused, cast):
        m.config.fused_norm = fused
        m.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=torch.bfloat16, enabled=cast):
            loss = m(x, y)[1]
        loss.backward()
        return {n: p.grad.double() for n, p in m.named_parameters()}

    ref = grads_of(copy.deepcopy(model).double(), False, False)
    plain, fused = (grads_of(model, on, autocast) for on in (False, True))
    for name, g in ref.items():
        err_plain, err_fused = ((grads[name] - g).norm().item() / g.norm().item() for grads in (plain, fused))
        print(f"{name}: {err_fused:.2e} with the kernels, {err_plain:.2e} without")
        assert err_fused <= 1.5 * err_plain + 1e-6, (name, err_fused, err_plain)
