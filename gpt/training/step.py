"""The training step: one function, which train.py and bench.py call and gpt/training/stepgraph.py captures, so a change
runs in all of them. It reads nothing back to the CPU (a NaN/inf gradient norm skips the update on the device, through
fused optimizers' found_inf): that lets a CUDA graph capture it, and spares an eager step a CPU-GPU sync."""
import math

import torch

from gpt.monitor.trainlog import duration, step_line
from gpt.runtime import distributed, hardware
from gpt.runtime.errors import UserError
from gpt.training.evaluation import all_ranks_mean


def train_step(model, optimizer, scaler, batches, micro_steps, ctx, grad_clip):
    """One optimizer step: forward and backward of each of the micro_steps (X, Y) micro-batches `batches`
    yields, clip the gradients at grad_clip (0: only measure their norm), update. Returns the step's mean loss
    and the gradient norm before clipping, as tensors; a non-finite norm means the update was skipped."""
    sync = getattr(model, 'grad_sync', None)  # ddp_sync='hooks' (gpt/runtime/distributed.py's GradSync)
    loss_sum = None
    for micro_step, (X, Y) in enumerate(batches):
        # gradients are reduced across ranks only at the last micro step
        distributed.set_gradient_sync(model, micro_step == micro_steps - 1)
        with ctx:
            _, loss = model(X, Y)
            loss = loss / micro_steps  # scale the loss to account for gradient accumulation
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        # backward pass, with gradient scaling if training in fp16
        scaler.scale(loss).backward()
    if sync:
        sync.wait()  # the gradients averaged over the ranks before they are read
    scaler.unscale_(optimizer)
    grad_norm = distributed.full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf))
    update(optimizer, scaler, grad_norm)
    # flush the gradients as soon as we can, no need for this memory anymore (GradSync's stay, zeroed in place)
    sync.zero_grad() if sync else optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def update(optimizer, scaler, grad_norm):
    """optimizer.step(), skipped for a non-finite grad_norm (docs/checkpoints.md#numerical-faults) or optimizer.held."""
    held = getattr(optimizer, 'held', False)
    adamw = [g for g in optimizer.param_groups if not g.get('muon')]
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
    elif adamw and all(g.get('fused') for g in adamw):
        optimizer.found_inf = (~torch.isfinite(grad_norm) | held).float()
        optimizer.step()
        del optimizer.found_inf
    elif math.isfinite(grad_norm) and not held:
        optimizer.step()


def set_lr(optimizer, lr):
    """Every group's learning rate for this step: a number, or a tensor the CUDA graph reads (filled in place). An AdamW
    group with an lr_scale (muon.py's learned scalars) takes lr times it; Muon's scale it in their step."""
    for group in optimizer.param_groups:
        rate = lr if group.get('muon') else lr * group.get('lr_scale', 1.0)
        if isinstance(group['lr'], torch.Tensor):
            group['lr'].fill_(rate)
        else:
            group['lr'] = rate


class NonFinite:
    """Updates skipped for a NaN/inf loss or gradient (train_step skips them on the device): counted, said, and
    after `limit` in a row the run stops with one line, naming where its last good checkpoint is."""

    def __init__(self, limit, skipped=0):
        self.limit, self.skipped, self.in_a_row = limit, skipped, 0

    def check(self, grad_norm, iter_num, last_good, master):
        self.in_a_row = 0 if math.isfinite(grad_norm) else self.in_a_row + 1
        if not self.in_a_row:
            return
        self.skipped += 1
        if master:
            print(f"iter {iter_num}: non-finite gradient norm, update skipped ({self.in_a_row} in a row)")
        if self.in_a_row >= self.limit:
            raise UserError(f"stopping: {self.in_a_row} steps in a row had a non-finite loss or gradient "
                            f"(max_nonfinite_steps={self.limit}); {last_good()}. Try a lower learning_rate, "
                            f"dtype=bfloat16, or check the data")


class StepMeter:
    """A training step's line and log row (docs/monitoring.md): every rank calls step, which averages the loss
    over them. MFU is a running mean from a launch's 6th step on: the first ones compile and warm up."""

    def __init__(self, log, model, run):
        self.log, self.model, self.run, self.mfu = log, model, run, -1.0
        self.peak_flops = hardware.peak_flops(run.device)
        self.timed = [0.0, 0]  # seconds and count of the logged steps after a launch's first

    def step(self, iter_num, local_iter_num, loss, lr, grad_norm, dt, skipped_steps, elapsed):
        run = self.run
        loss = all_ranks_mean(loss, run.device)  # a collective: on every rank, before the others return
        if not run.master:
            return
        if local_iter_num >= 5:
            if (mfu := self.model.estimate_mfu(run.micro_batch * run.micro_steps, dt, self.peak_flops)) is not None:
                self.mfu = mfu if self.mfu == -1.0 else 0.9 * self.mfu + 0.1 * mfu
        if local_iter_num >= 1:
            self.timed = [self.timed[0] + dt, self.timed[1] + 1]
        eta = max(run.max_iters - iter_num - 1, 0) * (self.timed[0] / self.timed[1] if self.timed[1] else dt)
        mem = torch.cuda.max_memory_allocated(run.device) / 2**30 if run.device_type == 'cuda' else None  # peak
        percent = 100 * (iter_num + 1) / max(run.max_iters, 1)  # of the run, once this step is done
        tokens = run.tokens_at(iter_num + 1)
        print(step_line(iter_num, loss, lr, grad_norm, dt, run.tokens_per_iter, self.mfu, mem, tokens, percent)
              + f", elapsed {duration(elapsed)}, eta {duration(eta)}")
        self.log.write(kind='train', step=iter_num, tokens=tokens, time=elapsed, percent=percent, loss=loss, lr=lr,
                       grad_norm=grad_norm, ms_per_step=dt * 1000, tokens_per_s=run.tokens_per_iter / dt,
                       mfu=self.mfu if self.mfu >= 0 else None, skipped_steps=skipped_steps, peak_mem_gib=mem)
