"""torch's optimizers without torch._dynamo's lazy import, a large share of start-up (docs/speedrun.md#start-up),
and configure(): nanoGPT's AdamW of a model, in decay and no-decay groups."""
import inspect

import torch


class WithoutDynamo:
    """Mixin before a torch.optim.Optimizer subclass: its methods without torch._dynamo's lazy import."""
    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)


class AdamW(WithoutDynamo, torch.optim.AdamW):
    """torch.optim.AdamW (fused=True on CUDA: one kernel for every tensor), its step without torch._dynamo."""

    @torch.no_grad()
    def step(self, closure=None):
        return inspect.unwrap(torch.optim.AdamW.step)(self, closure)


def configure(model, weight_decay, learning_rate, betas, device_type):
    """nanoGPT's AdamW of the trainable parameters: weight matrices and embeddings decay, biases and gains do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay_params, nodecay_params = [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]
    optim_groups = [dict(params=decay_params, weight_decay=weight_decay), dict(params=nodecay_params, weight_decay=0.0)]
    n_decay, n_nodecay = sum(p.numel() for p in decay_params), sum(p.numel() for p in nodecay_params)
    print(f"num decayed parameter tensors: {len(decay_params)}, with {n_decay:,} parameters")
    print(f"num non-decayed parameter tensors: {len(nodecay_params)}, with {n_nodecay:,} parameters")
    use_fused = device_type == "cuda"  # the fused kernel is much faster
    optimizer = AdamW(optim_groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))
    print(f"using fused AdamW: {use_fused}")
    return optimizer
