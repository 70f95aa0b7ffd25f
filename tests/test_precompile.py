"""gpt/kernels/dispatch.py's precompile: its stand-ins call each Triton kernel in every variant that a training step
and an evaluation call, or compiling them early would miss what the run needs. A kernel's variant is what Triton
compiles one binary for: its constexprs, each tensor's dtype and 16-byte alignment, and each integer's being 1 or
a multiple of 16. On the CPU under Triton's interpreter, every launch recorded that way."""
import pytest
from conftest import needs_triton, run_interpreted

VARIANTS = r"""
import torch
from gpt.kernels import cross_entropy, dispatch, fused_qk
from model import GPT, GPTConfig

calls = set()

def variant(a):
    if hasattr(a, "data_ptr"):
        return (str(a.dtype), a.data_ptr() % 16 == 0)
    if isinstance(a, int) and not isinstance(a, bool):
        return ("int", a == 1, a % 16 == 0)
    return type(a).__name__

class Recorder:
    def __init__(self, name, kernel):
        self.name, self.kernel = name, kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            calls.add((self.name, tuple(map(variant, args)), tuple(sorted(kwargs.items()))))
            return self.kernel[grid](*args, **kwargs)
        return launch

fused_qk._forward = Recorder("forward", fused_qk._forward)
fused_qk._backward = Recorder("backward", fused_qk._backward)
cross_entropy._loss_and_grad = Recorder("loss", cross_entropy._loss_and_grad)
dispatch.runs_on = lambda x: True  # the kernels run on the CPU here, under the interpreter

# heads, positions and batches whose products and strides are multiples of 16 or not, grouped-query attention
for shape in [dict(n_head=4, n_kv_head=2, block_size=6), dict(n_head=2, n_kv_head=2, block_size=8)]:
    for switches in [dict(qk_norm=True, pos_emb='rope'), dict(qk_norm=True), dict(pos_emb='rope', logit_softcap=15.0),
                     dict(family='llama')]:  # llama: rotary whatever pos_emb says
        cfg = GPTConfig(n_layer=1, n_embd=32, vocab_size=50, bias=False, fused_qk=True, fused_loss=True,
                        loss_chunk=16, **shape, **switches)
        model = GPT(cfg)
        train_batch, eval_batch = 3, 2
        for job in dispatch.warm_ups(cfg, (train_batch, eval_batch), 'float32', 'cpu'):
            job()
        warm, calls = calls, set()
        x = torch.randint(0, 50, (train_batch, cfg.block_size))
        model.train()
        model(x, x)[1].backward()
        model.eval()
        with torch.no_grad():
            model(x[:eval_batch], x[:eval_batch])
        ran, calls = calls, set()
        assert {c[0] for c in ran} == {"forward", "backward", "loss"}, ran
        assert ran <= warm, (shape, switches, ran - warm)
print("ok")
"""


@needs_triton
def test_precompile_calls_the_kernels_as_a_step_and_an_evaluation_do():
    run_interpreted(VARIANTS)


def test_precompile_does_nothing_without_a_cuda_gpu_or_a_fused_kernel(monkeypatch):
    from gpt.kernels import dispatch
    from model import GPT, GPTConfig
    fused = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=50, qk_norm=True, fused_qk=True,
                      fused_loss=True)
    plain = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=50, qk_norm=True)
    assert dispatch.warm_ups(plain, (2,), 'float32', 'cpu') == []  # before importing Triton, which may be absent

    def no(*args):
        raise AssertionError("a CPU model's kernels are plain PyTorch: nothing to compile")
    monkeypatch.setattr(dispatch, "warm_ups", no)
    dispatch.precompile(GPT(fused), (2, 2), 'float32', compiled=False)


@pytest.mark.cuda
def test_precompile_fills_the_kernel_caches_on_a_gpu():
    import torch

    from gpt.kernels import cross_entropy, dispatch, fused_qk
    from model import GPT, GPTConfig
    cfg = GPTConfig(n_layer=1, n_head=4, n_embd=128, block_size=64, vocab_size=256, qk_norm=True, pos_emb='rope',
                    fused_qk=True, fused_loss=True)
    model = GPT(cfg).cuda()
    dispatch.precompile(model, (4, 4), 'bfloat16', compiled=False)
    kernels = (fused_qk._forward, fused_qk._backward, cross_entropy._loss_and_grad)
    compiled = [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels]
    x = torch.randint(0, 256, (4, 64), device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        model(x, x)[1].backward()
    assert [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels] == compiled  # nothing new
    assert all(compiled), compiled
