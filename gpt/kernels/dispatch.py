"""Where gpt/kernels' Triton kernels run in place of model.py's plain PyTorch: on a CUDA GPU, uncompiled
(torch.compile fuses the plain paths by itself). Each kernel's module imports Triton, which CPU builds of torch
lack, so this is the one place that imports them, and only where they run."""
import contextlib
import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None  # torch's CUDA builds for Linux bring it


def runs_on(x):
    """Whether a Triton kernel can take tensor x here: on a CUDA GPU, outside torch.compile."""
    return x.is_cuda and not torch.compiler.is_compiling()


def loss_kernel(x):
    """gpt/kernels/cross_entropy.py's loss_and_grad_ where it runs for the hidden states x, else None."""
    if not (runs_on(x) and HAS_TRITON):
        return None
    from gpt.kernels.cross_entropy import loss_and_grad_  # imports Triton: only where it runs
    return loss_and_grad_


def qk_kernel(q):
    """gpt/kernels/fused_qk.py's norm_and_rotate where it runs for the queries q, else None. Triton is not
    checked here: the run plan turns fused_qk off without it (gpt/runtime/hardware.py's can_fuse_qk)."""
    if not runs_on(q):
        return None
    from gpt.kernels.fused_qk import norm_and_rotate  # imports Triton: only where it runs
    return norm_and_rotate


def compile_ahead(cfg, batch_sizes, dtype, device, compiled):
    """Start compiling the Triton kernels that precompile will call, each job in a process forked from this one,
    while this one goes on to its process group and model; precompile waits for them and loads the kernels from
    Triton's cache on disk. Processes, not threads: Triton's passes hold the interpreter's lock. A fork may not use
    CUDA once its parent has started it, so they compile for this GPU's target, named, on stand-ins in CPU memory,
    and launch nothing. Returns their process ids; a fork that fails costs time only (precompile compiles then)."""
    if compiled or torch.device(device).type != 'cuda' or not HAS_TRITON or not hasattr(os, 'fork'):
        return []
    if not (jobs := warm_ups(cfg, batch_sizes, dtype, 'cpu')):
        return []
    from triton.backends.compiler import GPUTarget  # imports Triton: only where it runs
    major, minor = torch.cuda.get_device_capability(device)
    return [compile_in_a_fork(job, GPUTarget('cuda', 10 * major + minor, 32)) for job in jobs]


def compile_in_a_fork(job, target):
    """Run one of warm_ups' jobs in a forked process that compiles its kernels for `target` (a Triton GPUTarget)
    into Triton's cache on disk, with the C modules Triton builds to launch them; returns the process's id."""
    if pid := os.fork():
        return pid
    status = 1
    try:  # the fork ends here, silently: no exit handlers of the parent's, nothing written to its output
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(1, 2)
        torch.set_num_threads(1)  # a CPU op on OpenMP's threads, which a fork does not have, would never return
        from triton.backends.nvidia.driver import CudaDriver, CudaLauncher, CudaUtils
        from triton.runtime import JITFunction, driver
        stand_in = CudaDriver.__new__(CudaDriver)  # names the device and target instead of asking CUDA
        stand_in.get_current_device, stand_in.get_current_target = (lambda: 0), (lambda: target)
        stand_in.get_current_stream = lambda device=None: 0
        driver.set_active(stand_in)
        built = []  # kernel[grid](...) compiles, launches nothing
        JITFunction.__getitem__ = lambda kernel, grid: lambda *a, **k: built.append(kernel.warmup(*a, grid=grid, **k))
        job()
        status = 0
        CudaUtils()  # Triton's CUDA utilities and each kernel's launcher, built with gcc (they need libcuda)
        for kernel in built:
            CudaLauncher(kernel.src, kernel.metadata)
    finally:
        os._exit(status)


def precompile(model, batch_sizes, dtype, compiled, ahead=()):
    """Compile the Triton kernels that the run will call before its first evaluation, each in a thread: a cold
    cache compiles them one by one at their first calls otherwise, and threads overlap their gcc and ptxas
    processes. batch_sizes: the training micro-batch's, then the evaluations'. ahead: compile_ahead's processes,
    waited for first: the kernels they compiled load from Triton's cache."""
    for pid in ahead:
        with contextlib.suppress(ChildProcessError):  # already reaped where SIGCHLD is ignored
            os.waitpid(pid, 0)
    device = next(model.parameters()).device
    if compiled or device.type != 'cuda' or not HAS_TRITON:
        return
    if not (jobs := warm_ups(model.config, batch_sizes, dtype, device)):
        return
    import triton  # imports Triton: only where it runs
    triton.runtime.driver.active.get_current_device()  # Triton's driver (a gcc build too), once, before the threads
    with ThreadPoolExecutor(len(jobs), initializer=torch.cuda.set_device, initargs=(device,)) as pool:
        for done in [pool.submit(job) for job in jobs]:
            done.result()
    torch.cuda.synchronize(device)


def warm_ups(cfg, batch_sizes, dtype, device):
    """precompile's jobs: each calls kernels once on stand-ins of the run's tensors (the shapes, strides and dtype
    that pick a variant; one that missed would cost time, never correctness). tests/test_precompile.py checks
    that they call every variant a step and an evaluation call."""
    if not (cfg.fused_qk or cfg.fused_loss):  # the plan keeps fused_qk only where there is something to fuse
        return []
    from gpt.kernels import cross_entropy, fused_qk  # imports Triton: only where it runs
    dtype, T, hs = getattr(torch, dtype), cfg.block_size, cfg.n_embd // cfg.n_head
    rope, eps = cfg.rotary, cfg.norm_eps if cfg.qk_norm else None
    cos = sin = torch.zeros(T, hs, device=device) if rope else None
    widths = [cfg.n_head * hs, cfg.n_kv_head * hs, cfg.n_kv_head * hs]
    views = [x.view(B, T, -1, hs) for B in dict.fromkeys(batch_sizes)  # q and k: views of c_attn's output
             for x in torch.empty(B, T, sum(widths), dtype=dtype, device=device).split(widths, -1)[:2]]

    def forward():
        for x in views:
            fused_qk._launch(fused_qk._forward, x, None, cos, sin, eps, rope)

    def backward():  # the gradient as SDPA's backward leaves it: laid out as q (flash) or as (B, heads, T, hs)
        for x in views[:2]:
            B, _, H, D = x.shape
            for g in (torch.empty(B, T, H, D, dtype=dtype, device=device),
                      torch.empty(B, H, T, D, dtype=dtype, device=device).transpose(1, 2)):
                fused_qk._launch(fused_qk._backward, x, g, cos, sin, eps, rope)

    def loss():
        rows = min(cfg.loss_chunk, batch_sizes[0] * T)
        logits = torch.empty(rows, cfg.vocab_size, dtype=dtype, device=device)
        cross_entropy.loss_and_grad_(logits, torch.zeros(rows, dtype=torch.long, device=device), cfg.logit_softcap)

    return [forward, backward] * cfg.fused_qk + [loss] * cfg.fused_loss
