"""gpt/kernels/dispatch.py's precompile: its stand-ins call each Triton kernel in every variant that a training step
and an evaluation call, or compiling them early would miss what the run needs. A kernel's variant is what Triton
compiles one binary for: its constexprs, each tensor's dtype and 16-byte alignment, and each integer's being 1 or
a multiple of 16. On the CPU under Triton's interpreter, every launch recorded that way. And gpt/kernels/ahead.py's
compilers: they compile, without torch or CUDA, the variants those stand-ins call, and on a GPU the run then loads
every one of them from Triton's cache."""
import pytest
from conftest import needs_triton, run_interpreted

VARIANTS = r"""
import torch
from gpt.kernels import cross_entropy, dispatch, fused_qk, layer_norm
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
layer_norm._forward = Recorder("norm", layer_norm._forward)
layer_norm._backward = Recorder("norm backward", layer_norm._backward)
dispatch.runs_on = lambda x: True  # the kernels run on the CPU here, under the interpreter

# heads, positions and batches whose products and strides are multiples of 16 or not, grouped-query attention
for shape in [dict(n_head=4, n_kv_head=2, block_size=6), dict(n_head=2, n_kv_head=2, block_size=8, bias=True)]:
    for switches in [dict(qk_norm=True, pos_emb='rope'), dict(qk_norm=True), dict(pos_emb='rope', logit_softcap=15.0),
                     dict(family='llama')]:  # llama: rotary whatever pos_emb says; its norms are RMSNorm
        norm = switches.get('family') != 'llama'
        cfg = GPTConfig(**{'n_layer': 1, 'n_embd': 32, 'vocab_size': 50, 'bias': False, 'fused_qk': True,
                           'fused_loss': True, 'fused_norm': norm, 'loss_chunk': 16, **shape, **switches})
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
        norms = {"norm", "norm backward"} if norm else set()
        assert {c[0] for c in ran} == {"forward", "backward", "loss"} | norms, ran
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

    from gpt.kernels import cross_entropy, dispatch, fused_qk, layer_norm
    from model import GPT, GPTConfig
    cfg = GPTConfig(n_layer=1, n_head=4, n_embd=128, block_size=64, vocab_size=256, qk_norm=True, pos_emb='rope',
                    fused_qk=True, fused_loss=True, fused_norm=True)
    model = GPT(cfg).cuda()
    dispatch.precompile(model, (4, 4), 'bfloat16', compiled=False)
    kernels = (fused_qk._forward, fused_qk._backward, cross_entropy._loss_and_grad, layer_norm._forward,
               layer_norm._backward)
    compiled = [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels]
    x = torch.randint(0, 256, (4, 64), device='cuda')
    with torch.autocast('cuda', dtype=torch.bfloat16):
        model(x, x)[1].backward()
    assert [sum(len(c[0]) for c in k.device_caches.values()) for k in kernels] == compiled  # nothing new
    assert all(compiled), compiled


def tiny_fused_config():
    # GPT-2's attention: q's and k's stand-ins as large as a real run's (a copy of them would use OpenMP's threads)
    from model import GPTConfig
    return GPTConfig(n_layer=1, n_head=12, n_embd=768, block_size=1024, vocab_size=256, qk_norm=True,
                     pos_emb='rope', fused_qk=True, fused_loss=True, fused_norm=True, bf16_residual=True)


AHEAD_ON_THE_CPU = r"""
import json, os, pathlib, sys
import torch
sys.path.insert(0, os.getcwd() + "/tests")
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime import driver
from test_precompile import tiny_fused_config
from gpt.kernels import ahead, dispatch

from unittest import mock
os.chdir("/")  # started from another folder, as a run may be, with nothing on PYTHONPATH
del os.environ["PYTHONPATH"]
with mock.patch.object(ahead.os.path, "exists", lambda path: path == "/proc/driver/nvidia"):  # a GPU driver here
    compilers = ahead.start()
assert len(compilers) == ahead.COMPILERS
torch.ones(1 << 22).add_(1)  # this process's OpenMP threads started, as train.py's data checks start them
stand_in = CudaDriver.__new__(CudaDriver)  # no GPU here: Triton is told an H100's target, as the compilers are
stand_in.get_current_device, stand_in.get_current_target = (lambda: 0), (lambda: GPUTarget("cuda", 90, 32))
stand_in.get_current_stream = lambda device=None: 0
driver.set_active(stand_in)
specs = dispatch.specializations(tiny_fused_config(), (16, 8), "bfloat16")
kernels = ["fused_qk._backward", "fused_qk._forward", "layer_norm._backward", "layer_norm._forward",
           "cross_entropy._loss_and_grad"]
assert sorted(json.loads(spec)["name"].split(".", 2)[2] for spec in specs) == sorted(kernels)
ahead.send(compilers, specs, (90, 32))
assert ahead.finish(compilers) == [0] * ahead.COMPILERS
cache = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
binaries = [path for path in cache.rglob("_*.cubin") if path.stem != "_empty"]  # ahead's warm-up kernel
assert sorted(path.stem for path in binaries) == sorted(k.split(".")[1] for k in kernels), binaries
assert {json.loads(path.with_suffix(".json").read_text())["target"]["arch"] for path in binaries} == {90}
print("ok")
"""


@needs_triton
def test_the_compilers_compile_what_they_are_sent_without_cuda_or_torch(tmp_path):
    # each compiler a new Python that imports neither torch nor CUDA; the kernels are those a run's stand-ins call
    import os
    import subprocess
    import sys
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", AHEAD_ON_THE_CPU], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-4000:]


@needs_triton
def test_a_compiler_loads_the_kernels_without_torch():
    import subprocess
    import sys
    code = ("import sys; import gpt.kernels.ahead, gpt.kernels.fused_qk, gpt.kernels.cross_entropy, "
            "gpt.kernels.layer_norm; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


AHEAD_ON_A_GPU = r"""
import os, sys
import torch
sys.path.insert(0, os.getcwd() + "/tests")
from test_precompile import tiny_fused_config
from gpt.kernels import ahead, dispatch
from model import GPT

compilers = ahead.start()  # before CUDA and OpenMP start here, as train.py starts them
assert len(compilers) == ahead.COMPILERS
cfg = tiny_fused_config()
torch.ones(1 << 22).add_(1)
dispatch.compile_ahead(compilers, cfg, (16, 8), 'bfloat16', 'cuda', compiled=False)
assert ahead.finish(compilers) == [0] * ahead.COMPILERS
files = lambda: {os.path.join(d, f) for d, _, names in os.walk(os.environ["TRITON_CACHE_DIR"]) for f in names}
compiled = files()
dispatch.precompile(GPT(cfg).cuda(), (16, 8), 'bfloat16', compiled=False)
assert files() == compiled, sorted(files() - compiled)  # every kernel and launcher found in the cache, none built again
print("ok")
"""


@pytest.mark.cuda
def test_the_kernels_compiled_ahead_are_the_ones_the_run_loads(tmp_path):
    import os
    import subprocess
    import sys
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", AHEAD_ON_A_GPU], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-4000:]


def test_a_compiler_that_died_costs_the_run_nothing_but_its_share():
    # train.py sends the work once the run is planned; a compiler gone by then must not stop the run
    import subprocess
    import sys

    from gpt.kernels import ahead
    compilers = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
                 for code in ("pass", "import sys; sys.stdin.read()")]
    compilers[0].wait()
    ahead.send(compilers, ["x" * 1_000_000, "y"], (90, 32))  # more than a pipe holds, for the one that died
    assert ahead.finish(compilers) == [0, 0] and all(c.stdin.closed for c in compilers)
