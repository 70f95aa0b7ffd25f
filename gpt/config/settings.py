"""
Settings that have the right type but make no sense (a negative learning rate, dropout 1.5, no layers, a
port beyond 65535, a negative checkpoint interval that would silently never save): the entry scripts check
them right after the configurator, so each is one `error:` line before any work.
"""
import os

from gpt.runtime.errors import UserError
from gpt.training.schedule import check_decay

NUCLEUS = (lambda v: 0 < v <= 1, "above 0 and at most 1 (1.0: no nucleus cut)")  # top-p sampling
POSITIVE = (lambda v: v > 0, "positive")
NOT_NEGATIVE = (lambda v: v >= 0, "0 or more")
FRACTION = (lambda v: 0 <= v < 1, "at least 0 and below 1")
# Muon's settings, checked alike by train.py and bench.py
MUON = [('muon_lr', lambda v: v > 0, "positive (for AdamW alone: --optimizer=adamw)"),
        ('muon_momentum', *FRACTION), ('muon_weight_decay', *NOT_NEGATIVE),
        ('scalar_lr', lambda v: v >= 0, "0 (learning_rate's) or more")]
PORT = (lambda v: 0 <= v <= 65535, "a TCP port, 0 to 65535 (0: any free port)")
# numpy's generators take any seed >= 0, torch.manual_seed up to 2**64 - 1; the scripts add the rank, the
# step or a stream number to the seed, so below 2**63 leaves them all room
SEED = (lambda v: 0 <= v < 2**63, "at least 0 and below 2**63")


def _check(rules, config):
    for key, ok, want in rules:
        if not ok(config[key]):
            raise UserError(f"{key}={config[key]!r} makes no sense: {key} must be {want}")


def check_init_folder(init_from):
    """init_from a folder: one that holds a transformers model (not a run's out_dir, not an empty one, its
    config.json readable, each field of its type), before anything reads its weights or tokenizer."""
    if os.path.isdir(init_from):
        from dataclasses import fields

        from gpt.hf import check_folder  # here: gpt.hf imports torch, and this module is imported first
        from model import GPTConfig
        check_folder(init_from, {f.name: f.type for f in fields(GPTConfig)})  # GPTConfig says each field's type


def check_train(c):
    """train.py's settings."""
    init_from = c['init_from']
    if not c['dataset'].strip() and not c['data_dir'].strip():
        raise UserError("dataset is empty: name one (e.g. --dataset=shakespeare_char), or give --data_dir")
    if not c['out_dir'].strip():
        raise UserError("out_dir is empty: give the folder the run writes to, e.g. --out_dir=out")
    if not (init_from in ('scratch', 'resume') or init_from.startswith('gpt2') or os.path.isdir(init_from)):
        raise UserError(f"unknown init_from '{init_from}': use scratch, resume, gpt2, gpt2-medium, "
                        f"gpt2-large, gpt2-xl or a folder written by transformers' save_pretrained")
    check_init_folder(init_from)
    if c['eval_iters'] <= 0 or c['eval_interval'] <= 0:
        raise UserError(f"eval_iters and eval_interval must be positive (got {c['eval_iters']}, {c['eval_interval']})")
    if min(c['batch_size'], c['block_size'], c['gradient_accumulation_steps'], c['log_interval']) <= 0 \
            or c['max_iters'] < 0:
        raise UserError("batch_size, block_size, gradient_accumulation_steps and log_interval must be "
                        "positive, max_iters not negative")
    _check([('dropout', *FRACTION),
            ('learning_rate', *POSITIVE), ('min_lr', *NOT_NEGATIVE),
            ('n_layer', *POSITIVE), ('n_head', *POSITIVE), ('n_embd', *POSITIVE),
            ('n_kv_head', lambda v: v >= 0, "0 (n_head) or more"), ('mlp_hidden', *NOT_NEGATIVE),
            ('rope_theta', *POSITIVE),
            ('weight_decay', *NOT_NEGATIVE), ('grad_clip', lambda v: v >= 0, "0 (off) or more"),
            ('beta1', *FRACTION), ('beta2', *FRACTION),
            ('warmup_iters', *NOT_NEGATIVE), ('lr_decay_iters', *NOT_NEGATIVE), ('max_nonfinite_steps', *POSITIVE),
            ('lr_decay_frac', lambda v: 0 < v <= 1, "above 0 and at most 1 (the fraction of the run 'wsd' "
                                                    "decays over)"),
            ('max_tokens', lambda v: v >= 0, "0 (max_iters) or more"),
            ('warmup_tokens', lambda v: v >= 0, "0 (warmup_iters) or more"),
            ('lr_decay_tokens', lambda v: v >= 0, "0 (lr_decay_iters) or more"),
            ('total_batch_size', lambda v: v >= 0, "0 (gradient_accumulation_steps) or more"),
            ('checkpoint_interval', lambda v: v >= -1, "-1 (never), 0 (at evaluations) or a number of steps"),
            ('keep_checkpoints', lambda v: v >= 0, "0 (none) or more"),
            ('ckpt_every_tokens', lambda v: v >= 0, "0 (off) or more"),
            ('hellaswag_interval', lambda v: v >= 0, "0 (off) or more"),
            ('sample_interval', lambda v: v >= 0, "0 (off) or more"),
            ('num_samples_train', *POSITIVE), ('sample_max_tokens', *POSITIVE),
            ('sample_top_p', *NUCLEUS), ('dashboard_port', *PORT), ('dist_timeout_minutes', *POSITIVE),
            *MUON, ('ddp_bucket_mb', *POSITIVE), ('seed', *SEED),
            ('compile_scope', lambda v: v in ('model', 'blocks'), "'model' or 'blocks' (gpt/runtime/distributed.py)"),
            ('init_device', lambda v: v in ('cpu', 'device'), "'cpu' (nanoGPT's weights for a seed) or 'device' "
                                                            "(drawn on the run's device: faster on a GPU, other "
                                                            "weights for the seed)")], c)
    check_decay(c['learning_rate'], c['min_lr'], c['lr_schedule'] if c['decay_lr'] else 'none')  # both valid


def inert(c):
    """The settings the user gave (config files or flags: c.given) that this run's other settings make do
    nothing, as lines "key=value does nothing here: why". train.py prints each as a note, not an error: a
    config file may set what a flag then turns off (--lr_schedule=wsd over a cosine config's lr_decay_iters)."""
    sched = c['lr_schedule'] if c['decay_lr'] else 'none'
    no_sampling = "sample_interval=0 draws no samples during training"
    rules = [
        (('warmup_iters', 'warmup_tokens'), sched == 'none',
         "decay_lr=False is nanoGPT's constant learning_rate without warm-up (lr_schedule='constant' warms up, "
         "then stays)"),
        (('lr_decay_iters', 'lr_decay_tokens'), sched in ('constant', 'wsd', 'none'),
         f"only lr_schedule='cosine' decays over lr_decay_iters (this run: "
         f"{'decay_lr=False' if sched == 'none' else repr(sched)}"
         f"{', which decays over the last lr_decay_frac of max_iters' if sched == 'wsd' else ''})"),
        (('lr_decay_frac',), sched != 'wsd', "only lr_schedule='wsd' uses it"),
        (('gradient_accumulation_steps',), c['total_batch_size'] > 0,
         f"total_batch_size={c['total_batch_size']:,} sets the batch; the micro-steps follow from it and batch_size"),
        (('min_lr',), sched in ('constant', 'none'), "a constant learning_rate never decays to it"),
        (('lr_schedule',), sched == 'none', "decay_lr=False keeps learning_rate constant, whatever the schedule"),
        _without_muon(c),
        (('scalar_lr',), c['optimizer'] == 'muon' and c['init_from'] == 'scratch' and not c['value_embeds']
         and not c['skip_connections'], "the model has no learned scalars (value_embeds, skip_connections)"),
        (('sample_prompt', 'sample_max_tokens', 'sample_top_p', 'num_samples_train'), c['sample_interval'] == 0,
         no_sampling),
        (('dashboard_port',), not c['dashboard'], "dashboard=False serves no dashboard"),
        (('dashboard',), c.get('eval_only', False), "eval_only writes no log for the page to show"),
        (('compile_scope',), not c['compile'], "compile=False compiles nothing"),
        (('keep_checkpoints',), c['checkpoint_interval'] == -1 and c['ckpt_every_tokens'] == 0,
         "checkpoint_interval=-1 saves no checkpoints"),
    ]
    return _unused(c, rules)


def inert_sample(c):
    """inert's lines for sample.py's settings."""
    greedy = "temperature=0 decodes greedily (the likeliest token), so no token is drawn"
    return _unused(c, [(('top_k', 'top_p'), c['temperature'] == 0, greedy),
                       (('out_dir',), c['init_from'] != 'resume',
                        f"init_from={c['init_from']!r} loads that model, not out_dir's checkpoint")])


def _without_muon(c):
    """The rule (keys, unused, why) for Muon's settings under another optimizer."""
    return (('muon_lr', 'muon_momentum', 'muon_weight_decay', 'muon_shard', 'scalar_lr'), c['optimizer'] != 'muon',
            f"optimizer={c['optimizer']!r} trains without Muon")


def _unused(c, rules):
    """(keys, whether they are unused, why) rules -> a line for each unused key the user gave (c.given)."""
    given = getattr(c, 'given', ())
    return [f"{key}={c[key]!r} does nothing here: {why}"
            for keys, unused, why in rules if unused for key in keys if key in given]


def check_sample(c):
    """sample.py's settings."""
    check_init_folder(c['init_from'])
    _check([('num_samples', lambda v: v > 0, "positive"), ('max_new_tokens', lambda v: v > 0, "positive"),
            ('temperature', lambda v: v >= 0, "0 (greedy) or more"),
            ('top_k', lambda v: v >= 0, "0 (all tokens) or more"), ('top_p', *NUCLEUS), ('seed', *SEED)], c)


def check_bench(c):
    """bench.py's settings."""
    for key in ('batch_sizes', 'gen_batch_sizes'):
        if not all(b.strip().isdigit() and int(b) > 0 for b in c[key].split(',') if b.strip()):
            raise UserError(f"{key}={c[key]!r} makes no sense: {key} must be positive integers separated by "
                            f"commas (e.g. 12,32)")
    _check([('block_size', *POSITIVE), ('n_layer', *POSITIVE), ('n_head', *POSITIVE), ('n_embd', *POSITIVE),
            ('vocab_size', *POSITIVE), ('dropout', *FRACTION), ('learning_rate', *POSITIVE),
            ('weight_decay', *NOT_NEGATIVE), ('grad_clip', lambda v: v >= 0, "0 (off) or more"),
            ('warmup_steps', *NOT_NEGATIVE), ('timed_steps', *POSITIVE), ('gen_tokens', *POSITIVE),
            ('top_k', lambda v: v >= 0, "0 (all tokens) or more"), ('seed', *SEED),
            ('activation_memory_budget', lambda v: 0 <= v <= 1, "between 0 and 1 (1: recompute nothing)"),
            ('check_batch_size', lambda v: v >= 0, "0 (skip) or more"),
            ('peak_flops', lambda v: v >= 0, "0 (from the table) or more"), *MUON], c)


def inert_bench(c):
    """bench.py's settings the user gave that its other settings make do nothing (as inert())."""
    return _unused(c, [_without_muon(c), (('muon_shard',), c['optimizer'] == 'muon', "bench.py runs one process")])


def check_hellaswag(c):
    """hellaswag.py's settings."""
    check_init_folder(c['init_from'])
    _check([('limit', lambda v: v >= 0, "0 (all examples) or more"), ('batch_examples', *POSITIVE)], c)


def check_dashboard(c):
    """dashboard.py's settings."""
    _check([('port', *PORT)], c)
