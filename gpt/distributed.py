"""
How the model is spread over the processes torchrun starts: joining the process group, DDP or FSDP2.

- 'ddp': every GPU holds the whole model; gradients are all-reduced, overlapped with the backward pass
  (DistributedDataParallel), and only on the last micro-step of gradient accumulation.
- 'fsdp': FSDP2 (torch.distributed.fsdp.fully_shard) shards parameters, gradients and optimizer state over
  the GPUs, each transformer block gathered only while it computes; for models whose weights, gradients
  and AdamW state do not fit one GPU. Its sharded checkpoints are gpt/checkpoint.py's.
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.errors import UserError


def init_process(device, backend, timeout_minutes):
    """Under torchrun, join the process group, each process on the GPU of its local rank. Returns (under
    torchrun?, rank, local rank, world size, this process's device); one process alone is rank 0 of 1."""
    if int(os.environ.get("RANK", -1)) == -1:
        return False, 0, 0, 1, device
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    cuda = device.split(":")[0] == "cuda"
    if cuda:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    timeout = timedelta(minutes=timeout_minutes)
    dist.init_process_group(backend=backend or ("nccl" if cuda else "gloo"), timeout=timeout,
                            device_id=torch.device(device) if cuda else None)
    return True, rank, local_rank, world_size, device


def wrap(model, parallelism, device_type, local_rank, dtype, compile=False):
    """The model as this process trains it: compiled (when `compile`), then wrapped for DDP or sharded."""
    if parallelism == "ddp":
        if compile:
            print("compiling the model... (takes a ~minute)")
            model = torch.compile(model)
        if not (dist.is_available() and dist.is_initialized()):
            return model
        return DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
    if parallelism != "fsdp":
        raise UserError(f"unknown parallelism '{parallelism}': use ddp or fsdp")
    if not (dist.is_available() and dist.is_initialized()):
        raise UserError("parallelism=fsdp needs several processes: launch with torchrun --nproc_per_node=N")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # compute in the run's dtype; reduce gradients in float32, as DDP does (bf16 sums of many ranks lose bits)
    param_dtype = getattr(torch, dtype) if dtype != "float32" else None
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        if compile:
            block.compile()  # in place, per block: keeps parameter names and the FSDP units intact
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # embeddings, final norm and the (tied) head
    return model


def rank_zero_first(load):
    """load() on rank 0 first, then on the other ranks (which then find what rank 0 downloaded)."""
    if not (dist.is_available() and dist.is_initialized()):
        return load()
    if dist.get_rank() == 0:
        result = load()
    dist.barrier()
    if dist.get_rank() != 0:
        result = load()
    return result


def set_gradient_sync(model, sync):
    """Reduce gradients on this micro-step or not: only on the last micro-step of gradient accumulation,
    one reduction per step. (FSDP then keeps unsharded gradients between micro-steps, in the compute dtype.)"""
    if isinstance(model, DDP):
        model.require_backward_grad_sync = sync
    elif hasattr(model, "set_requires_gradient_sync"):  # an FSDP2 module
        model.set_requires_gradient_sync(sync)


def unwrap(model):
    return model.module if isinstance(model, DDP) else model


def total_norm(norm):
    """clip_grad_norm_ returns a DTensor for sharded parameters: the full value, as a float."""
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


def checkpoint_activations(model):
    """Recompute each block's activations in the backward pass instead of keeping them: much less memory
    for about a third more compute. Done by overriding each block's forward, so parameter names and the
    FSDP units stay as they are."""
    from torch.utils.checkpoint import checkpoint
    for block in model.transformer.h:
        block.forward = (lambda f: lambda *args: checkpoint(f, *args, use_reentrant=False))(block.forward)
