"""The run plan: what a training run is, decided once, before anything is touched (docs/configuration.md#the-run-plan).
make() reads the settings, the weights' source, the dataset and the machine, runs every check that can fail and
returns a frozen RunPlan that train.py reads the run from; record() is what checkpoints and log.jsonl keep."""
import os
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType

import torch

from gpt import checkpoint, hf, optim
from gpt.checkpoint import rundir
from gpt.data import dataset_label, find_dataset
from gpt.data.tokenizer import check_data_for_model, get_tokenizer
from gpt.monitor.trainlog import check_wandb
from gpt.optim import muon
from gpt.runtime import distributed, hardware, settings
from gpt.runtime.errors import UserError
from gpt.training import schedule, stepgraph
from model import ARCHITECTURE, GPT, INITIALISATION, RUNTIME, GPTConfig

# OpenAI's GPT-2 checkpoints on the hub (their config.json), so that a plan needs no download
GPT2_HUB = {'gpt2': dict(n_layer=12, n_head=12, n_embd=768),  # 124M params
            'gpt2-medium': dict(n_layer=24, n_head=16, n_embd=1024),  # 350M params
            'gpt2-large': dict(n_layer=36, n_head=20, n_embd=1280),  # 774M params
            'gpt2-xl': dict(n_layer=48, n_head=25, n_embd=1600)}  # 1558M params


@dataclass(frozen=True)
class Source:
    """Where the weights come from: kind 'scratch', 'resume' (checkpoint: load_for_resume's dict) or 'pretrained'
    (weights: a folder's state dict; None for a GPT-2 name, downloaded by build_model after every check)."""
    kind: str
    name: str = ''
    model_args: dict = field(default_factory=dict)
    run_config: dict = field(default_factory=dict)  # the settings a checkpoint's run recorded
    checkpoint: dict = None
    weights: dict = None


def source(init_from, out_dir, parallelism):
    """Read (never write, never download) what the run starts from."""
    if init_from == 'scratch':
        return Source('scratch')
    if init_from == 'resume':
        ckpt = checkpoint.load_for_resume(out_dir, parallelism)
        return Source('resume', ckpt['path'], dict(ckpt['model_args']), dict(ckpt.get('config') or {}), ckpt)
    if init_from in GPT2_HUB:
        check_reachable(init_from)
        return Source('pretrained', init_from, dict(GPT2_HUB[init_from], vocab_size=50257, block_size=1024, bias=True))
    # a folder (check_settings refused any other name): read now, so its problems come before any side effect
    args, weights = hf.load_pretrained(init_from)
    return Source('pretrained', init_from, args, weights=weights)


def check_settings(c):
    """Every declared check (gpt/runtime/settings.py), and what train.py's settings must be together."""
    if not c['dataset'].strip() and not c['data_dir'].strip():
        raise UserError("dataset is empty: name one (e.g. --dataset=shakespeare_char), or give --data_dir")
    if not c['out_dir'].strip():
        raise UserError("out_dir is empty: give the folder the run writes to, e.g. --out_dir=out")
    init_from = c['init_from']
    if not (init_from in ('scratch', 'resume') or init_from in GPT2_HUB or os.path.isdir(init_from)):
        raise UserError(f"unknown init_from '{init_from}': use scratch, resume, gpt2, gpt2-medium, "
                        f"gpt2-large, gpt2-xl or a folder written by transformers' save_pretrained")
    check_init_folder(init_from)
    settings.check(c, c.declared)
    schedule.check_decay(c['learning_rate'], c['min_lr'], schedule.in_effect(c))  # both valid


def check_init_folder(init_from):
    """An init_from folder must hold a transformers model (not a run's out_dir; config.json readable, each field of
    GPTConfig's type), checked before anything reads it. sample.py and hellaswag.py check theirs here too."""
    if os.path.isdir(init_from):
        hf.check_folder(init_from, {f.name: f.type for f in fields(GPTConfig)})


def check_reachable(name):
    """A hub model that cannot be had is refused now, not after out_dir was claimed: offline (HF_HUB_OFFLINE)
    it must be in the local cache. Online, only the download itself can tell."""
    from huggingface_hub import constants, try_to_load_from_cache
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(name, 'config.json'), str):
        raise UserError(f"init_from={name}: its weights are not in the Hugging Face cache and HF_HUB_OFFLINE is set: "
                        f"download them once with a network (python -c \"from transformers import GPT2LMHeadModel; "
                        f"GPT2LMHeadModel.from_pretrained('{name}')\"), or pass a local transformers folder")


@dataclass(frozen=True)
class RunPlan:
    init: str  # 'scratch', 'resume' or 'pretrained'
    init_from: str  # the setting: scratch, resume, a GPT-2 name or a folder
    source: str  # the checkpoint's path or the pretrained model's name or folder ('' from scratch)
    model: MappingProxyType  # every GPTConfig field of the model that trains: GPTConfig(**plan.model)
    block_size: int
    # the processes: torchrun's, or one alone (rank 0 of 1)
    torchrun: bool
    rank: int
    local_rank: int
    world_size: int
    device: str  # this process's: cuda:<local rank> under torchrun
    dtype: str
    # the data
    data_dir: str
    data_label: str  # how messages name it
    prepare_hint: str  # the command that prepares it
    meta: MappingProxyType  # its metadata (vocab_size, tokenizer, dtype); None: GPT-2 BPE in uint16, nanoGPT's
    # the batch and the schedule
    micro_steps: int  # forward/backward passes per optimizer step on each process
    micro_batch: int  # sequences in each of them (batch_size, or fewer where the global batch needs it)
    eval_batch: int  # sequences in an evaluation's batch: one process's micro_batch, however many run
    tokens_per_iter: int  # per optimizer step, all processes together
    start_iter: int  # the step the run starts at (a resumed checkpoint's)
    start_tokens: int  # the tokens trained on before it, over every earlier launch
    max_iters: int
    warmup_iters: int
    lr_decay_iters: int
    lr_schedule: str  # in effect: 'none' with decay_lr=False
    # how it runs, as it will, not as asked: compile, a CUDA graph, DDP or FSDP2, the optimizer
    compile: bool
    compile_scope: str  # 'model' or 'blocks' (fsdp: always blocks)
    cuda_graph: bool
    parallelism: str  # 'ddp' or 'fsdp' under torchrun; 'none' for one process
    optimizer: MappingProxyType  # name and hyperparameters (gpt/optim/__init__.py builds it)
    out_dir: str
    writes: bool  # False with eval_only: nothing is written to out_dir
    earlier_run: tuple  # a new run's out_dir holds these files of an earlier run: they are moved aside
    notes: tuple  # lines said before the run starts: settings that do nothing here, and why
    settings: MappingProxyType  # every setting as the run uses it (the model's, the derived counts)

    def __getattr__(self, name):
        """Every setting as the run uses it (run.eval_interval); the fields above are what the plan decided besides."""
        if name != 'settings' and name in self.settings:
            return self.settings[name]
        raise AttributeError(f"the run plan has no {name!r}")

    @property
    def device_type(self):
        return self.device.split(':')[0]

    @property
    def vocab_size(self):
        """Of the data's token ids: the dataset's, else (nanoGPT's GPT-2 data) the model's."""
        return self.meta['vocab_size'] if self.meta else self.model['vocab_size']

    @property
    def token_dtype(self):
        return self.meta['dtype'] if self.meta else 'uint16'

    @property
    def master(self):
        """The process that logs, checkpoints and prints (rank 0)."""
        return self.rank == 0

    @property
    def sharded(self):
        """Checkpoints in shards, every rank its own (fsdp under torchrun)."""
        return self.parallelism == 'fsdp'

    def tokens_at(self, iter_num):
        """Tokens trained on once iter_num steps are done: the earlier launches' count, then this one's rate."""
        return self.start_tokens + (iter_num - self.start_iter) * self.tokens_per_iter

    def record(self):
        """The plan as plain data, for checkpoints and log.jsonl."""
        plain = lambda v: dict(v) if isinstance(v, MappingProxyType) else list(v) if isinstance(v, tuple) else v
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


def make(config):
    """(plan, source()'s answer, whose checkpoint tensors build_model and checkpoint.restore use) from the
    configurator's Config. Every check that can fail runs here; nothing is written, joined or downloaded."""
    check_settings(config)
    if config['wandb_log']:
        check_wandb()  # installed, and a key or offline mode
    device = hardware.resolve_device(config['device'])
    cuda = device.split(':')[0] == 'cuda'
    ranks = distributed.launch(os.environ, torch.cuda.device_count() if cuda else 0)
    rank, local_rank, world_size = ranks or (0, 0, 1)
    if ranks and cuda:
        device = f"cuda:{local_rank}"  # each process on the GPU of its local rank
    dtype = hardware.resolve_dtype(config['dtype'], device.split(':')[0])
    given = getattr(config, 'given', frozenset())
    data_dir, meta, hint = find_dataset(config['dataset'], config['data_dir'], rank == 0, named='dataset' in given)
    src = source(config['init_from'], config['out_dir'], config['parallelism'])
    run = decide(config, src, meta, world_size, device, dtype, torchrun=ranks is not None, rank=rank,
                 local_rank=local_rank, data=(data_dir, dataset_label(config['dataset'], config['data_dir']), hint),
                 verbose=rank == 0)
    return run, src


def decide(config, src, meta, world_size, device, dtype, torchrun=False, rank=0, local_rank=0, data=('', '', ''),
           verbose=False):
    """make()'s decisions from what it found: src (source()'s answer), meta (None: GPT-2 BPE), the processes, this one's
    device and the dtype. verbose: print how token settings became counts, and what is off here."""
    given = getattr(config, 'given', frozenset())
    device_type = device.split(':')[0]
    model = model_config(config, given, src, meta)
    if src.checkpoint and 'model' in src.checkpoint:  # before a model of model_args' size is allocated
        checkpoint.check_fits(GPTConfig(**model), src.checkpoint['model'], src.name)
    check_resume(config, given, src)
    data_dir, data_label, prepare_hint = data
    if meta and meta['vocab_size'] > model['vocab_size']:
        raise UserError(f"{data_label} has vocab_size {meta['vocab_size']} but the model only {model['vocab_size']}: "
                        f"the data and the model use different tokenizers")
    check_data_for_model(meta, config['init_from'], src.checkpoint, data_label)  # the data's tokenizer is the model's
    block_size = model['block_size']
    total_batch_size, batch_note = schedule.global_batch(config, block_size)
    micro_steps, micro_batch = schedule.split_batch(total_batch_size, config['gradient_accumulation_steps'],
                                                    config['batch_size'], block_size, world_size, verbose)
    eval_batch = schedule.split_batch(total_batch_size, config['gradient_accumulation_steps'],
                                      config['batch_size'], block_size, 1, verbose=False)[1]
    tokens_per_iter = micro_steps * world_size * micro_batch * block_size
    start_iter, start_tokens = started(src, tokens_per_iter)
    max_iters, warmup_iters, lr_decay_iters = schedule.iterations(config, tokens_per_iter, given, verbose,
                                                                  start=(start_iter, start_tokens))
    lr_schedule = schedule.in_effect(config)
    notes = settings.notes(config, config.declared) + schedule.check_lengths(max_iters, warmup_iters,
                                                                           lr_decay_iters, lr_schedule)
    notes[:0] = [batch_note] if batch_note else []  # first: it says what the run's batch is
    parallelism = config['parallelism'] if torchrun else 'none'
    compiled = hardware.can_compile(config['compile'], device_type, verbose)
    compile_scope = distributed.check(config['parallelism'], config, compiled, torchrun)
    for name in ('fused_qk', 'fused_norm'):
        model[name] = hardware.can_fuse(name, model[name], GPTConfig(**model), device_type, compiled, verbose)
    model['bf16_residual'] = hardware.can_bf16_residual(model['bf16_residual'], dtype, verbose)
    if torchrun:
        distributed.check_backend(config['backend'], device_type)  # now, not when the group is joined
    graphed = stepgraph.can_graph(config['cuda_graph'], device_type,
                                  torchrun and (config['parallelism'], config['ddp_sync'], config['backend']), dtype,
                                  config['activation_checkpointing'], verbose)
    optimizer = optimizer_settings(config, given, parallelism)
    if parallelism == 'fsdp' and (config['ckpt_every_tokens'] or config['hellaswag_interval']):
        raise UserError("ckpt_every_tokens and hellaswag_interval do not work with parallelism=fsdp yet: use "
                        "checkpoint_interval, and evaluate checkpoints with hellaswag.py")
    if config['sample_interval']:
        check_prompt(config['sample_prompt'], meta, model['vocab_size'])
    fresh, writes = src.kind != 'resume', not config['eval_only']
    if rank == 0 and writes:
        rundir.check(config['out_dir'], fresh=fresh)  # writable, and no live run in it
    earlier = tuple(rundir.earlier_run(config['out_dir']) if fresh and os.path.isdir(config['out_dir']) else ())
    settings_ = dict(config)
    settings_.update({k: v for k, v in model.items() if k in settings_})  # the model that runs, not the flags
    settings_.update(block_size=block_size, batch_size=micro_batch, total_batch_size=total_batch_size,
                     gradient_accumulation_steps=micro_steps * world_size, max_iters=max_iters,
                     warmup_iters=warmup_iters, lr_decay_iters=lr_decay_iters, device=device, dtype=dtype,
                     compile=compiled, compile_scope=compile_scope, cuda_graph=graphed)
    return RunPlan(init=src.kind, init_from=config['init_from'], source=src.name, model=MappingProxyType(model),
                   block_size=block_size, torchrun=torchrun, rank=rank, local_rank=local_rank, world_size=world_size,
                   device=device, dtype=dtype, data_dir=data_dir, data_label=data_label, prepare_hint=prepare_hint,
                   meta=MappingProxyType(dict(meta)) if meta else None, micro_steps=micro_steps, eval_batch=eval_batch,
                   micro_batch=micro_batch, tokens_per_iter=tokens_per_iter, start_iter=start_iter,
                   start_tokens=start_tokens, max_iters=max_iters, warmup_iters=warmup_iters,
                   lr_decay_iters=lr_decay_iters, lr_schedule=lr_schedule, compile=compiled,
                   compile_scope=compile_scope, cuda_graph=graphed, parallelism=parallelism,
                   optimizer=MappingProxyType(optimizer), out_dir=config['out_dir'], writes=writes,
                   earlier_run=earlier, notes=tuple(notes), settings=MappingProxyType(settings_))


def config_line(run, config):
    """train.py's `config:` line: the settings the plan made other than the defaults, config files and flags gave
    them (the configurator said what those set), and where every setting is kept."""
    decided = " ".join(f"{k}={v!r}" for k, v in run.settings.items() if k in config and v != config[k])
    kept = f"; every setting: the plan row of {os.path.join(run.out_dir, 'log.jsonl')}" if run.writes else ""
    return f"config: {decided or 'as given'} (as the run plan decided{kept})"


def started(src, tokens_per_iter):
    """(step, tokens trained on) where the run starts: 0 for a new one; a checkpoint's count, else its steps at the
    rate its run recorded: its plan's, else its config's batch (nanoGPT's gradient_accumulation_steps there counts
    every process's micro-steps, as ours does), else this run's, said in a note."""
    if src.kind != 'resume':
        return 0, 0
    ckpt = src.checkpoint or {}
    iter_num = int(ckpt.get('iter_num') or 0)
    if ckpt.get('tokens') is not None:
        return iter_num, int(ckpt['tokens'])
    rate = (ckpt.get('plan') or {}).get('tokens_per_iter')
    if not (type(rate) is int and rate > 0):
        batch = [src.run_config.get(k) for k in ('gradient_accumulation_steps', 'batch_size', 'block_size')]
        rate = batch[0] * batch[1] * batch[2] if all(type(v) is int and v > 0 for v in batch) else None
    if rate is None and iter_num and os.environ.get('RANK', '0') == '0':
        print(f"note: {src.name} records neither its tokens nor its batch (gradient_accumulation_steps, batch_size, "
              f"block_size in its config): its {iter_num} steps are counted at this run's {tokens_per_iter:,} "
              f"tokens each")
    return iter_num, iter_num * (rate or tokens_per_iter)


def optimizer_settings(config, given, parallelism):
    name = config['optimizer']
    if name == 'adamw' and 'muon_lr' in given and 'optimizer' not in given:
        raise UserError(f"muon_lr={config['muon_lr']} is set but the optimizer is AdamW: Muon is chosen with "
                        f"--optimizer=muon (muon_lr is its rate)")
    optim.check(name, parallelism)
    chosen = dict(name=name, learning_rate=config['learning_rate'], min_lr=config['min_lr'],
                  betas=[config['beta1'], config['beta2']], weight_decay=config['weight_decay'],
                  grad_clip=config['grad_clip'])
    if name == 'muon':
        chosen.update({k: config[k] for k in muon.SETTINGS})
    return chosen


def check_prompt(prompt, meta, vocab_size):
    """sample_prompt must encode in the dataset's tokenizer into ids the model has: now, not after hours of training."""
    try:
        ids = get_tokenizer(dict(meta) if meta else None).encode(prompt)
    except (KeyError, ValueError, UserError) as e:
        raise UserError(f"sample_prompt={prompt!r} cannot be encoded by the dataset's tokenizer ({e}): use text "
                        f"the dataset holds, or --sample_interval=0") from None
    if not ids or max(ids) >= vocab_size:
        raise UserError(f"sample_prompt={prompt!r} encodes to " + ("no tokens" if not ids else
                        f"id {max(ids)}, beyond the model's {vocab_size}") + ": give a prompt of the dataset's text")


def check_resume(config, given, src):
    """A resumed run changing a setting declared kept(why) is refused in one line (the model's fields: model_config)."""
    if src.kind != 'resume' or not src.run_config:
        return
    theirs = dict(src.run_config)
    theirs.setdefault('optimizer', 'muon' if theirs.get('muon_lr') else 'adamw')  # before the setting existed
    theirs.setdefault('scalar_lr', 0.0)
    for key, why in settings.resume_groups(config.declared)['kept'].items():
        if key in theirs and config[key] != theirs[key]:
            raise UserError(f"{src.name} was trained with {key}={theirs[key]!r} and a resumed run keeps it ({why}), "
                            f"but this one has {key}={config[key]!r}: resume with --{key}={theirs[key]!r} (or the "
                            f"config that set it), or start a new run (--init_from=scratch) in another out_dir")


def model_config(config, given, src, meta):
    """Every GPTConfig field of the model the run trains, as a dict (GPTConfig's derived values filled in)."""
    runtime = {k: config[k] for k in GPTConfig.fields_of(RUNTIME) if k in config}
    if src.kind == 'scratch':
        settable = {k: config[k] for k in GPTConfig.fields_of(ARCHITECTURE) + GPTConfig.fields_of(INITIALISATION)
                    if k in config}
        return asdict(GPTConfig(**settable, **runtime, vocab_size=new_vocab_size(meta)))
    # weights to start from: their architecture, this run's runtime fields
    unknown = sorted(set(src.model_args) - {f.name for f in fields(GPTConfig)})
    if unknown:  # a field of a newer version, or another program's: building without it would be another model
        raise UserError(f"{src.name} describes its model with {', '.join(unknown)}, which this version's GPTConfig "
                        f"does not have (model.py): load it with the version that wrote it")
    try:
        theirs = asdict(GPTConfig(**{k: v for k, v in src.model_args.items() if k in GPTConfig.architecture_fields()}))
    except (TypeError, ValueError) as e:  # a value of the wrong type ("n_head": "2"): GPTConfig's arithmetic fails
        raise UserError(f"{src.name}: its model fields do not describe a GPT ({e})")
    crop = src.kind == 'pretrained' and 'block_size' in given and config['block_size'] <= theirs['block_size']
    refuse_other_architecture(config, given, src, theirs, skip=('block_size',) if crop else ())
    inits = {k: src.run_config.get(k, getattr(GPTConfig, k)) for k in GPTConfig.fields_of(INITIALISATION)}
    refuse_ignored_initialisation(config, given, src, inits)
    return {**theirs, **inits, **runtime, 'block_size': config['block_size'] if crop else theirs['block_size']}


def new_vocab_size(meta):
    """A new model's vocabulary: the data's (GPT-2's 50257 without metadata) rounded up to a multiple of 64 for faster
    matmuls; a character vocabulary gets one more id instead, unused by the data: an export's end-of-text and pad."""
    if meta is None:
        return 50304
    if meta['tokenizer'] == 'char':
        return meta['vocab_size'] + 1
    return -(-meta['vocab_size'] // 64) * 64


def refuse_other_architecture(config, given, src, theirs, skip=()):
    """One line for every architecture field the user set that differs from the model being started from.
    Values are compared as GPTConfig understands them (n_kv_head=0 is n_head, mlp_hidden=0 the default)."""
    keys = [k for k in GPTConfig.fields_of(ARCHITECTURE) if k in given and k not in skip]
    try:
        asked = asdict(GPTConfig(**{**theirs, **{k: config[k] for k in keys},
                                    **{k: 0 for k in ('n_kv_head', 'mlp_hidden') if k in keys and not config[k]}}))
    except UserError:  # the fields given do not even make a model together: compare them as they are
        asked = {k: config[k] for k in keys}
    if not (differ := [k for k in keys if asked[k] != theirs[k]]):
        return
    what = (f"the checkpoint {src.name} is a" if src.kind == 'resume' else f"the pretrained model {src.name} is a")
    shape = f"{theirs['n_layer']}-layer, {theirs['n_embd']}-wide {theirs['family']} model"
    keep = ("a resumed model keeps its architecture" if src.kind == 'resume' else
            "a pretrained model keeps its architecture (block_size may only be smaller: the model is cropped)")
    raise UserError(f"{what} {shape}; {keep}, but this run sets "
                    + ", ".join(f"{k}={config[k]!r} (model: {theirs[k]!r})" for k in differ)
                    + ": leave " + ("it" if len(differ) == 1 else "them") + " out, or train a new model "
                    "(--init_from=scratch) in another out_dir")


def refuse_ignored_initialisation(config, given, src, made_with):
    """An initialisation field does nothing when the weights exist already: a value the user gave that differs
    from made_with (what made them: the checkpoint's run's values; a pretrained model's: the defaults) is refused."""
    if differ := [k for k in made_with if k in given and config[k] != made_with[k]]:
        raise UserError(", ".join(f"{k}={config[k]!r}" for k in differ) + " only sets how a new model's weights "
                        f"start, and this run starts from {src.name}'s weights (made with "
                        + ", ".join(f"{k}={made_with[k]!r}" for k in differ) + "): leave it out, or train a new "
                        "model with --init_from=scratch")


def build_model(plan, src, seed):
    """The plan's model: new (the same initial weights on every rank), the checkpoint's (a sharded one's load once the
    model is sharded: checkpoint.restore), or pretrained (a GPT-2 name's downloaded here) and cropped."""
    device = plan.device if plan.settings.get('init_device') == 'device' else 'cpu'
    if src.kind == 'scratch':
        model = init_model(plan.model, seed, device)
    elif src.kind == 'resume':
        model = init_model(plan.model, None, device)  # its weights are the checkpoint's, its random state too
        if not src.checkpoint['sharded']:
            checkpoint.load_weights(model, src.checkpoint['model'], src.name)
    else:
        args, weights = (src.model_args, src.weights) if src.weights is not None else hf.load_pretrained(src.name)
        full = {**plan.model, 'block_size': args['block_size']}
        if mismatch := [k for k in GPTConfig.fields_of(ARCHITECTURE)
                        if k != 'block_size' and args.get(k, full[k]) != full[k]]:
            raise UserError(f"{src.name}'s weights are not the model its config describes ({', '.join(mismatch)})")
        model = init_model(full, None, device)
        checkpoint.load_weights(model, weights, src.name)
        if plan.block_size < model.config.block_size:
            model.crop_block_size(plan.block_size)  # model surgery: fewer positions than it was trained on
    assert asdict(model.config) == dict(plan.model), "the model built is not the plan's"
    return model


def init_model(model_config, seed=None, device='cpu'):
    """A new GPT of model_config, its weights drawn on `device` from the seed (None: the random state as it is; a seed
    leaves it as it was). On the CPU a seed gives nanoGPT's weights on any machine, slowly at GPT-2's size (every weight
    is drawn twice: torch's init, then GPT-2's); on a GPU from its own generator: same distributions, other weights."""
    device = torch.device(device)
    on_device = device.type != 'cpu'
    # device_type is always named, since torch versions read None differently; with devices=[] no device's
    # state is touched, whatever the type
    fork = torch.random.fork_rng(devices=[device] if on_device else [],
                                 device_type=device.type if on_device else 'cuda')
    with fork if seed is not None else nullcontext(), device if on_device else nullcontext():
        if seed is not None:
            torch.manual_seed(seed)
        return GPT(GPTConfig(**model_config))
