"""When things happen in a run: the learning-rate schedule, a step's batch split over the processes, the token
budgets as iteration counts, and which evaluations, samples and checkpoints are due at a step."""
import math
from typing import NamedTuple

from gpt.runtime.errors import UserError

LR_SCHEDULES = ('cosine', 'constant', 'wsd')


def check_decay(learning_rate, min_lr, lr_schedule):
    """A schedule that decays to min_lr (cosine, wsd) must start above it: else it climbs, which is never what
    was meant (a --learning_rate lowered for fine-tuning, with train.py's min_lr left as it was)."""
    if lr_schedule in ('cosine', 'wsd') and min_lr > learning_rate:
        raise UserError(f"min_lr={min_lr:g} is above learning_rate={learning_rate:g}, so the '{lr_schedule}' "
                        f"schedule would rise to min_lr rather than decay: set --min_lr at most learning_rate "
                        f"(learning_rate/10 is usual)")


def get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters, lr_schedule='cosine', lr_decay_frac=0.2,
           max_iters=None):
    """Step `it`'s learning rate, never 0 at step 0; 'none' (nanoGPT's decay_lr=False): learning_rate, no warm-up."""
    if lr_schedule == 'none':
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if lr_schedule == 'constant':
        return learning_rate
    if lr_schedule == 'wsd':
        decay_iters = max(1, round(lr_decay_frac * max_iters))
        decay_start = max(max_iters - decay_iters, warmup_iters)
        if it < decay_start:
            return learning_rate
        progress = min(1.0, (it - decay_start + 1) / max(max_iters - decay_start, 1))
        return learning_rate + progress * (min_lr - learning_rate)
    if it >= lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


def split_batch(total_batch_size, gradient_accumulation_steps, batch_size, block_size, world_size, verbose=True):
    """(micro_steps, micro_batch): the global batch (total_batch_size tokens, else gradient_accumulation_steps x
    batch_size sequences) shared equally by the processes, each in the fewest equal micro-batches up to batch_size."""
    if total_batch_size:
        if total_batch_size % block_size:
            lower = total_batch_size // block_size * block_size
            raise UserError(f"total_batch_size={total_batch_size:,} is not a whole number of sequences of "
                            f"block_size={block_size:,} tokens: use "
                            + (f"{lower:,} or " if lower else "") + f"{lower + block_size:,}")
        sequences, given = total_batch_size // block_size, f"total_batch_size={total_batch_size:,}"
    else:
        sequences = gradient_accumulation_steps * batch_size
        given = f"gradient_accumulation_steps={gradient_accumulation_steps} x batch_size={batch_size}"
    if sequences % world_size:
        processes = [n for n in range(1, min(sequences, 64) + 1) if sequences % n == 0]
        per = world_size * block_size
        lower = sequences * block_size // per * per
        tokens = (f"{lower:,} or " if lower else "") + f"{lower + per:,}"
        raise UserError(f"the global batch of {sequences:,} sequences ({given}) cannot be shared equally by "
                        f"{world_size} processes: start {', '.join(map(str, processes))} of them (--nproc_per_node), "
                        f"or set --total_batch_size={tokens} (a multiple of {world_size} x block_size {block_size:,})")
    share = sequences // world_size  # sequences per process and step
    micro_steps = next(m for m in range(-(-share // batch_size), share + 1) if share % m == 0)
    micro_batch = share // micro_steps
    if verbose and (total_batch_size or micro_batch != batch_size):
        print(f"{given} -> gradient_accumulation_steps={micro_steps * world_size:,}"
              + (f" ({micro_steps} per process)" if world_size > 1 else "")
              + f" of {micro_batch} sequences of {block_size:,} tokens"
              + (f" (batch_size={batch_size} is the most a micro-step takes)" if micro_batch != batch_size else ""))
    return micro_steps, micro_batch


SHAPE = ('batch_size', 'block_size', 'gradient_accumulation_steps')  # what a micro-batch and a step are made of


def batch_changes(c):
    """(where, shape, later): the config file (or 'flags') that last set total_batch_size, SHAPE's values there,
    and those of them that a later config file or flags set (from the configurator's c.sources)."""
    declared = getattr(c, 'declared', {})
    now = {k: declared[k].default for k in SHAPE if k in declared}
    where, shape, later = None, {}, {}
    for name, values in getattr(c, 'sources', ()):
        now.update((k, values[k]) for k in SHAPE if k in values)
        if 'total_batch_size' in values:
            where, shape, later = name, dict(now), {}
        else:
            later.update((k, values[k]) for k in SHAPE if k in values)
    return where, shape, later


def global_batch(c, block_size):
    """(total_batch_size, note): the tokens a step at this block_size (0: nanoGPT's gradient_accumulation_steps x
    batch_size sequences), and why when a later SHAPE changed it (docs/configuration.md, total_batch_size)."""
    total = c['total_batch_size']
    where, shape, later = batch_changes(c)
    if not total or not later:
        return total, None
    changed = " and ".join(f"{k}={v}" for k, v in later.items())
    there = "the flags'" if where == 'flags' else f"{where}'s"
    micro = shape['batch_size'] * shape['block_size']
    if 'gradient_accumulation_steps' in later:
        steps, was = later['gradient_accumulation_steps'], ""
    elif total % micro:
        raise UserError(f"{changed} came after {there} total_batch_size={total:,}, which is not a whole number of "
                        f"micro-batches of batch_size={shape['batch_size']} x block_size={shape['block_size']}, so "
                        f"the batch they mean is unclear: give --total_batch_size={total} to keep it (batch_size "
                        f"then only caps a micro-batch), or --gradient_accumulation_steps=N for a batch of N "
                        f"micro-batches of batch_size x block_size")
    else:
        steps = total // micro
        was = f" ({micro_batches(steps)} of {shape['batch_size']} x {shape['block_size']})"
    new = steps * c['batch_size'] * block_size
    if new == total:
        return total, None
    return new, (f"{changed} came after {there} total_batch_size={total:,}{was}, so the batch is "
                 f"{micro_batches(steps)} of {c['batch_size']} x {block_size}, total_batch_size={new:,}, as in nanoGPT "
                 f"(give --total_batch_size to keep a batch in tokens: batch_size then only caps a micro-batch)")


def micro_batches(n):
    return f"{n} micro-batch" + ("es" if n > 1 else "")


def iterations(config, tokens_per_iter, given, verbose=True, start=(0, 0)):
    """(max_iters, warmup_iters, lr_decay_iters), each *_tokens setting turned into steps (docs/llama.md#token-budgets),
    counted from start: (step, tokens trained on) where a resumed run begins, whose earlier launches may have had
    another batch. given: the keys the user set. Checks lr_schedule and lr_decay_frac too."""
    lr_schedule, lr_decay_frac = config.get('lr_schedule', 'cosine'), config.get('lr_decay_frac', 0.2)
    if lr_schedule not in LR_SCHEDULES:
        raise UserError(f"unknown lr_schedule {lr_schedule!r}: use one of {', '.join(LR_SCHEDULES)}")
    if not 0 < lr_decay_frac <= 1:
        raise UserError(f"lr_decay_frac={lr_decay_frac} must be in (0, 1]: the fraction of the run that 'wsd' "
                        f"decays over (e.g. 0.2)")
    out = {}
    # a run sets one of each pair, the tokens one wins when given
    for iters_key, tokens_key in (('max_iters', 'max_tokens'), ('warmup_iters', 'warmup_tokens'),
                                  ('lr_decay_iters', 'lr_decay_tokens')):
        n, tokens = config[iters_key], config[tokens_key]
        if n < 0 or tokens < 0:
            raise UserError(f"{iters_key} and {tokens_key} cannot be negative (got {n}, {tokens})")
        if tokens > 0:
            if iters_key in given and n != 0:
                raise UserError(f"{iters_key}={n} and {tokens_key}={tokens} are both set: give one "
                                f"(--{iters_key}=0 to use {tokens_key})")
            n = step_at(tokens, tokens_per_iter, *start)
            if verbose:
                print(f"{tokens_key}={tokens:,} -> {iters_key}={n:,} ({tokens_per_iter:,} tokens per iteration)")
        out[iters_key] = n
    decay_given = config['lr_decay_tokens'] or ('lr_decay_iters' in given and config['lr_decay_iters'] != 0)
    if config['max_tokens'] and not decay_given:
        out['lr_decay_iters'] = out['max_iters']
        if verbose:
            print(f"lr_decay_iters={out['max_iters']:,} (the end of max_tokens)")
    return out['max_iters'], out['warmup_iters'], out['lr_decay_iters']


def step_at(tokens, tokens_per_iter, start_iter=0, start_tokens=0):
    """First step after which `tokens` are trained on: at this launch's rate, or before it the earlier ones' mean."""
    if tokens <= start_tokens:
        return math.ceil(tokens * start_iter / start_tokens)
    return start_iter + math.ceil((tokens - start_tokens) / tokens_per_iter)


def check_lengths(max_iters, warmup_iters, lr_decay_iters, lr_schedule):
    """Schedule lengths that are well defined but unlikely to be what was meant, as note lines."""
    if lr_schedule != 'none' and warmup_iters > max_iters:
        return [f"warmup_iters={warmup_iters:,} is beyond max_iters={max_iters:,}: the run ends still warming up, "
                f"at {(max_iters + 1) / (warmup_iters + 1):.0%} of learning_rate"]
    if lr_schedule == 'cosine' and lr_decay_iters < warmup_iters < max_iters:
        return [f"lr_decay_iters={lr_decay_iters:,} is below warmup_iters={warmup_iters:,}: at the end of the "
                f"warm-up the rate drops straight to min_lr (set lr_decay_iters ~ max_iters to decay)"]
    return []


def crossed(tokens, tokens_per_iter, every):
    """Whether a step of tokens_per_iter that ended at `tokens` seen passed a multiple of `every`."""
    return every > 0 and tokens > 0 and tokens // every > (tokens - tokens_per_iter) // every


class Due(NamedTuple):
    loss: bool  # evaluate the train/val loss
    hellaswag: bool  # evaluate HellaSwag
    samples: bool  # draw samples (not at step 0 of a training run: its weights are untrained)
    checkpoint: bool  # checkpoint_interval's turn (or the end of the run)
    tokens: int  # tokens seen, when a ckpt_every_tokens checkpoint is due (else 0)
    last: bool  # the run ends after this step's evaluations


def due(iter_num, max_iters, eval_only, resumed_here, eval_interval, hellaswag_interval, sample_interval,
        tokens_per_iter, ckpt_every_tokens, checkpoint_interval=0, tokens=None, at_start=True):
    """What is due at step iter_num, before it trains: each interval's multiples and the last step (all with eval_only).
    A run resumed at this step skips it all (its run did it before saving), as does step 0 without at_start
    (eval_at_start=False). tokens: trained on by then (default iter_num * tokens_per_iter)."""
    tokens = iter_num * tokens_per_iter if tokens is None else tokens
    last = iter_num >= max_iters
    fresh = (not resumed_here and (at_start or iter_num > 0 or last)) or eval_only
    every = lambda interval: bool(interval and fresh and (iter_num % interval == 0 or last or eval_only))
    crossing = fresh and not eval_only and crossed(tokens, tokens_per_iter, ckpt_every_tokens)
    return Due(loss=every(eval_interval) or crossing, hellaswag=every(hellaswag_interval),
               samples=every(sample_interval) and (iter_num > 0 or eval_only),  # step 0's weights are untrained
               checkpoint=every(checkpoint_interval) and checkpoint_interval > 0,
               tokens=tokens if crossing else 0, last=last)


# train.py's declarations of the schedule's settings: the values that make sense, and when one does nothing
CHECKPOINT_INTERVAL = (lambda v: v >= -1, "-1 (never), 0 (at evaluations) or a number of steps")
DECAY_FRAC = (lambda v: 0 < v <= 1, "above 0 and at most 1 (the fraction of the run 'wsd' decays over)")


def in_effect(c):
    return c['lr_schedule'] if c['decay_lr'] else 'none'


def no_decay_iters(c):
    sched = in_effect(c)
    return sched in ('constant', 'wsd', 'none') and (
        f"only lr_schedule='cosine' decays over lr_decay_iters (this run: "
        f"{'decay_lr=False' if sched == 'none' else repr(sched)}"
        f"{', which decays over the last lr_decay_frac of max_iters' if sched == 'wsd' else ''})")


# train.py's `unused` tests of the schedule's settings: why one does nothing in this run, else a false value
no_warmup = lambda c: in_effect(c) == 'none' and ("decay_lr=False is nanoGPT's constant learning_rate without "
                                                  "warm-up (lr_schedule='constant' warms up, then stays)")
no_decay_frac = lambda c: in_effect(c) != 'wsd' and "only lr_schedule='wsd' uses it"
no_min_lr = lambda c: in_effect(c) in ('constant', 'none') and "a constant learning_rate never decays to it"
no_schedule = lambda c: in_effect(c) == 'none' and "decay_lr=False keeps learning_rate constant, whatever the schedule"
batch_in_tokens = lambda c: c['total_batch_size'] > 0 and 'gradient_accumulation_steps' not in batch_changes(c)[2] and (
    f"total_batch_size={c['total_batch_size']:,} sets the batch; the micro-steps follow from it and batch_size")
never_saves = lambda c: c['checkpoint_interval'] == -1 and c['ckpt_every_tokens'] == 0 and (
    "checkpoint_interval=-1 saves no checkpoints")
saves_in_step = lambda c: never_saves(c) or c['parallelism'] == 'fsdp' and (  # async_save's
    "parallelism='fsdp' writes its shards as training waits")
