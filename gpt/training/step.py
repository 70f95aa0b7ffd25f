"""
The training step: one function, which train.py and bench.py call and the CUDA graph of gpt/training/stepgraph.py
captures. A change to the step (an auxiliary loss, another clipping) is made here once and runs in every one
of them.

It reads nothing back to the CPU: the loss and the gradient norm stay tensors, and a NaN/inf gradient norm
skips the update on the device, through the found_inf flag that fused optimizers (every CUDA run's) read for
GradScaler. That is what lets a CUDA graph capture it, and it spares an eager step a CPU-GPU sync.
"""
import math

import torch

from gpt.runtime import distributed


def train_step(model, optimizer, scaler, batches, micro_steps, ctx, grad_clip):
    """One optimizer step: forward and backward of each of the micro_steps (X, Y) micro-batches `batches`
    yields, clip the gradients at grad_clip (0: only measure their norm), update. Returns the step's mean loss
    and the gradient norm before clipping, as tensors; a non-finite norm means the update was skipped."""
    loss_sum = None
    for micro_step, (X, Y) in enumerate(batches):
        # gradients are reduced across ranks only at the last micro step
        distributed.set_gradient_sync(model, micro_step == micro_steps - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / micro_steps  # scale the loss to account for gradient accumulation
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        # backward pass, with gradient scaling if training in fp16
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grad_norm = distributed.full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf))
    update(optimizer, scaler, grad_norm)
    # flush the gradients as soon as we can, no need for this memory anymore
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def update(optimizer, scaler, grad_norm):
    """optimizer.step(), skipped where grad_norm is not finite: a NaN/inf loss or gradient would poison the
    weights. float16: the GradScaler finds the infs itself (and lowers its scale). A fused optimizer skips it on
    the device; others (CPU, MPS) read the norm. optimizer.held (the CUDA graph's warm-up) skips every update."""
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
    elif is_fused(optimizer):
        skip = ~torch.isfinite(grad_norm)
        optimizer.found_inf = (skip | getattr(optimizer, 'held', False)).float()
        optimizer.step()
        del optimizer.found_inf
    elif math.isfinite(grad_norm) and not getattr(optimizer, 'held', False):
        optimizer.step()


def is_fused(optimizer):
    """Whether every AdamW group of the optimizer runs the fused kernel, which reads found_inf (Muon's groups,
    gpt/optim/muon.py, read it themselves)."""
    groups = [g for g in optimizer.param_groups if not g.get('muon')]
    return bool(groups) and all(g.get('fused') for g in groups)


def set_lr(optimizer, lr):
    """Every group's learning rate for this step: a tensor the CUDA graph reads (filled in place), or a number.
    An AdamW group with an lr_scale (gpt/optim/muon.py's learned scalars) takes lr times it; Muon's groups take lr
    and scale it in their own step."""
    for group in optimizer.param_groups:
        rate = lr if group.get('muon') else lr * group.get('lr_scale', 1.0)
        if isinstance(group['lr'], torch.Tensor):
            group['lr'].fill_(rate)
        else:
            group['lr'] = rate
