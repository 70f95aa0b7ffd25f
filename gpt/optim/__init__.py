"""The optimizers train.py's `optimizer` setting names (AdamW, or Muon for the blocks' matrices and AdamW for the
rest): check() refuses what cannot work, build() makes one, load_state() resumes it under this run's settings."""
from gpt.optim import muon
from gpt.runtime.errors import UserError

# train.py's `optimizer` setting: what trains the weights
OPTIMIZERS = {'adamw': "AdamW for every parameter (nanoGPT's)",
              'muon': "Muon for the transformer blocks' matrices, AdamW for the rest (gpt/optim/muon.py)"}
KEPT = "its state (moments, Muon's momentum) is that optimizer's"  # why a resumed run keeps `optimizer`


def check(name, parallelism):
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer '{name}': use "
                        + " or ".join(f"'{k}' ({why})" for k, why in OPTIMIZERS.items()))
    if name == 'muon' and parallelism == 'fsdp':
        raise UserError("optimizer='muon' does not work with parallelism=fsdp (Muon needs whole matrices, FSDP shards "
                        "them): use parallelism=ddp or optimizer='adamw'")


def build(model, chosen, device_type):
    """The optimizer of the model's trainable parameters that `chosen` (the run plan's: name, learning_rate,
    betas, weight_decay, and Muon's settings) names: gpt/optim/adamw.py's or muon.py's configure()."""
    lr, wd, betas = chosen['learning_rate'], chosen['weight_decay'], tuple(chosen['betas'])
    if chosen['name'] == 'adamw':
        return model.configure_optimizers(wd, lr, betas, device_type)
    return muon.configure(model.hidden_matrices(), [p for p in model.parameters() if p.requires_grad], lr,
                          chosen['muon_lr'], wd, chosen['muon_weight_decay'], betas, chosen['muon_momentum'],
                          device_type, chosen['muon_shard'], model.learned_scalars(), chosen.get('scalar_lr', 0.0),
                          chosen.get('muon_nesterov', True))


def load_state(optimizer, state_dict):
    """A checkpoint's optimizer state (moments, step counts) in this run's optimizer, which keeps this run's
    hyperparameters (torch's load_state_dict would bring back the saved run's); ValueError for another optimizer's."""
    mine = [{k: v for k, v in group.items() if k != 'params'} for group in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    for group, settings in zip(optimizer.param_groups, mine):
        group.update(settings)
