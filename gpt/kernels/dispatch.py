"""Where gpt/kernels' Triton kernels run in place of model.py's plain PyTorch: on a CUDA GPU, uncompiled
(torch.compile fuses the plain paths by itself). Each kernel's module imports Triton, which CPU builds of torch
lack, so this is the one place that imports them, and only where they run."""
import importlib.util

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
