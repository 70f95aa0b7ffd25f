"""Which device, precision and compile mode a run gets. Shared by train.py, sample.py and bench.py so that
each resolves 'auto', reports what it chose, and rejects what cannot work with one clear line."""
import importlib.util
import shutil
from contextlib import nullcontext

import torch

from gpt.runtime.errors import UserError

# train.py's init_device: where a new model's weights are drawn (gpt/training/plan.py's init_model says why)
INIT_DEVICES = (lambda v: v in ('cpu', 'device'), "'cpu' (nanoGPT's weights for a seed) or 'device' (drawn on the "
                "run's device: faster on a GPU, other weights for the seed)")
# Dense bf16/fp16 tensor-core peak FLOP/s from the vendors' datasheets, matched against the device name.
# First match wins, so more specific names come first. Override with peak_flops=... when yours is missing.
PEAK_FLOPS = [("GH200", 989e12), ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H800", 989e12),
              ("B200", 2250e12), ("A100", 312e12), ("A800", 312e12), ("A10G", 70e12), ("A10", 125e12), ("L40S", 362e12),
              ("L4", 121e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("V100", 125e12), ("T4", 65e12)]


def peak_flops(device):
    """The datasheet peak of the GPU in use, or None (CPU, MPS, a GPU not in the table)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS if key in name), None)


def resolve_device(device):
    """'auto' picks cuda, then mps, then cpu and says which; an explicit device must exist."""
    if device.split(":")[0] in ("auto", "cuda") and torch.cuda._is_in_bad_fork():  # else auto would pick the CPU
        raise UserError("this process was forked from one that had started CUDA, where CUDA cannot start again: with "
                        "torchrun --start-method=fork set PYTORCH_NVML_BASED_CUDA_CHECK=1 (GPUs counted without CUDA)")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
        print(f"device: {device} (auto)")
        return device
    kind = device.split(":")[0]
    if kind not in ("cuda", "cpu", "mps"):
        raise UserError(f"unknown device '{device}': use auto, cuda, cuda:N, cpu or mps")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device={device} but CUDA is not available here: use --device=cpu (or auto)")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise UserError(f"device={device} but only {torch.cuda.device_count()} CUDA device(s) exist")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UserError("device=mps but MPS is not available here: use --device=cpu (or auto)")
    return device


def resolve_dtype(dtype, device_type):
    """'auto': bfloat16 on GPUs that have it, float16 on older GPUs, float32 on CPU and MPS."""
    if dtype == "auto":
        return ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if device_type == "cuda" else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise UserError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
    if dtype == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("dtype=bfloat16 is not supported on this GPU: use --dtype=float16 (with loss scaling)")
    if dtype == "float16" and device_type == "cpu":
        raise UserError("dtype=float16 needs a GPU: use --dtype=bfloat16 or --dtype=float32 on the CPU")
    return dtype


def autocast(device_type, dtype):
    """Mixed precision for the forward pass (weights stay float32)."""
    return nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))


def for_generation(model, device_type, dtype):
    """The context to generate in. On a GPU the weights are cast to the dtype once: under autocast, float32
    weights would be cast again for every token (docs/generation.md). Elsewhere they stay, as in training."""
    if device_type == "cuda" and dtype != "float32":
        model.to(getattr(torch, dtype))
        return nullcontext()
    return autocast(device_type, dtype)


def attention_kernels(cudnn):
    """Whether SDPA may pick cuDNN's kernel (False: flash attention, the same math, without cuDNN's slow cold start)."""
    torch.backends.cuda.enable_cudnn_sdp(cudnn)


def compile_problem(device_type):
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    if device_type == "mps":
        return "torch.compile does not support MPS well"
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "no C++ compiler found for the CPU backend"
    return None


def can_compile(compile, device_type, verbose=True):
    """Whether to torch.compile: asked for, and able to work here (else, verbose, say why not)."""
    problem = compile and compile_problem(device_type)
    if problem and verbose:
        print(f"compile: off ({problem})")
    return bool(compile and not problem)


def maybe_compile(model, compile, device_type, **options):
    if not can_compile(compile, device_type):
        return model
    print("compiling the model... (takes a ~minute)")
    return torch.compile(model, **options)


def can_bf16_residual(bf16_residual, dtype, verbose=True):
    """Whether the residual stream runs in bf16 (model.py): asked for, under bf16 autocast (else, verbose, say why)."""
    if bf16_residual and dtype != 'bfloat16' and verbose:
        print(f"bf16_residual: off (dtype={dtype}: the stream takes bfloat16 autocast's dtype)")
    return bool(bf16_residual and dtype == 'bfloat16')


def can_fuse(name, wanted, model, device_type, compiled, verbose=True):
    """Whether model.py runs fused path `name` ('fused_qk', 'fused_norm') as its gpt/kernels Triton kernel: asked
    for, and able to work here (else, verbose, say why not: the plain path computes the same). model: GPTConfig."""
    nothing = {'fused_qk': not (model.qk_norm or model.rotary) and "neither qk_norm nor rotary embeddings to fuse",
               'fused_norm': model.family != 'gpt2' and "llama's norms are RMSNorm, not LayerNorm"}[name]
    problem = wanted and (
        nothing if nothing
        else f"needs a CUDA GPU (this run: {device_type})" if device_type != 'cuda'
        else "compile=True fuses them itself" if compiled
        else "triton is not installed" if importlib.util.find_spec("triton") is None else None)
    if problem and verbose:
        print(f"{name}: off ({problem})")
    return bool(wanted and not problem)


SLOW_RUN_SECONDS = 24 * 3600  # a run projected to take longer than this on a CPU or MPS gets a warning


def pace_warning(seconds_per_step, steps_left, device_type):
    """After a run's first step: one warning line when the rest would take more than a day on a CPU or Apple
    GPU (GPT-2 124M's defaults on a laptop: years), else None. GPUs are left alone: long runs are their job."""
    total = seconds_per_step * steps_left
    if device_type == 'cuda' or total <= SLOW_RUN_SECONDS:
        return None
    days = total / 86400
    span = (f"{days / 365:.1f} years" if days >= 365 else f"{days:.0f} days" if days >= 2
            else f"{total / 3600:.0f} hours")
    return (f"warning: the first step took {seconds_per_step:.1f}s on {device_type}: the {steps_left:,} steps left "
            f"would take ~{span}. For a try on this machine use a smaller model and batch (config/quickstart.py "
            f"picks one for CPUs) or fewer max_iters; Ctrl-C stops the run")
