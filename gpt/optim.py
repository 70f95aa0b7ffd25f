"""
The optimizers: train.py's `optimizer` setting names one (AdamW or Muon), build() makes it and load_state()
resumes it under this run's settings. They are torch's, started without torch._dynamo:

torch.optim wraps Optimizer.add_param_group, zero_grad, state_dict and load_state_dict in
torch._disable_dynamo, and each optimizer's step in a wrapper that calls torch._dynamo.graph_break(); both
import torch._dynamo at their first call. That import takes longer than the rest of a run's start-up together
(seconds on a fresh GPU machine, docs/speedrun.md's start-up table), and what it buys matters only while
torch.compile traces the optimizer itself, which this trainer never does (it compiles the model). WithoutDynamo
calls the very functions those wrappers wrap (inspect.unwrap), with the step under torch.no_grad() as torch's
wrapper runs it: the same arithmetic, the same state_dict, the same hooks (the step's profiling and hook
wrapper, which Optimizer.__init__ adds, is kept). A run that compiles imports torch._dynamo anyway.
"""
import inspect

import torch

from gpt.errors import UserError


class WithoutDynamo:
    """Mixin before a torch.optim.Optimizer subclass: its methods without torch._dynamo's lazy import."""

    def add_param_group(self, param_group):
        return inspect.unwrap(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none=True):
        return inspect.unwrap(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self):
        return inspect.unwrap(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict):
        return inspect.unwrap(torch.optim.Optimizer.load_state_dict)(self, state_dict)


class AdamW(WithoutDynamo, torch.optim.AdamW):
    """torch.optim.AdamW (fused=True on CUDA: one kernel for every tensor), its step without torch._dynamo."""

    @torch.no_grad()
    def step(self, closure=None):
        return inspect.unwrap(torch.optim.AdamW.step)(self, closure)


# train.py's `optimizer` setting: what trains the weights
OPTIMIZERS = {
    'adamw': "AdamW for every parameter (nanoGPT's)",
    'muon': "Muon for the transformer blocks' matrices, AdamW for the rest (gpt/muon.py)",
}


def check(name, parallelism):
    """The optimizer setting, refused in one line where it cannot work."""
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer '{name}': use "
                        + " or ".join(f"'{k}' ({why})" for k, why in OPTIMIZERS.items()))
    if name == 'muon' and parallelism == 'fsdp':
        raise UserError("optimizer='muon' does not work with parallelism=fsdp (Muon needs whole matrices, FSDP shards "
                        "them): use parallelism=ddp or optimizer='adamw'")


def build(model, chosen, device_type):
    """The optimizer of the model's trainable parameters that `chosen` (the run plan's: name, learning_rate,
    betas, weight_decay, and Muon's settings) names. AdamW: matrices and embeddings decay, biases and norm
    gains do not (model.configure_optimizers, nanoGPT's). Muon: gpt/muon.py's MuonAdamW."""
    lr, wd, betas = chosen['learning_rate'], chosen['weight_decay'], tuple(chosen['betas'])
    if chosen['name'] == 'adamw':
        return model.configure_optimizers(wd, lr, betas, device_type)
    from gpt import muon
    return muon.configure(model.hidden_matrices(), [p for p in model.parameters() if p.requires_grad], lr,
                          chosen['muon_lr'], wd, chosen['muon_weight_decay'], betas, chosen['muon_momentum'],
                          device_type, chosen['muon_shard'])


def load_state(optimizer, state_dict):
    """A checkpoint's optimizer state (moments, step counts) in this run's optimizer, which keeps this run's
    hyperparameters: torch's load_state_dict also brings back every group's lr, betas, weight_decay, Muon's
    momentum and rate, as the run that saved them had them, which would silently overrule this run's
    settings. Raises ValueError where the state is another optimizer's (other groups)."""
    mine = [{k: v for k, v in group.items() if k != 'params'} for group in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    for group, settings in zip(optimizer.param_groups, mine):
        group.update(settings)
