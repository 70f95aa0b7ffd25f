"""Evaluation during training: each split's mean loss over fixed batches, over all ranks, and a few samples."""
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from gpt.generation import until_eot
from gpt.monitor.trainlog import duration
from gpt.runtime.settings import NOT_NEGATIVE, NUCLEUS, POSITIVE, Setting

_no_samples = lambda c: c['sample_interval'] == 0 and "sample_interval=0 draws no samples during training"

# train.py's settings for what it evaluates besides the loss, set like train.py's own (gpt/runtime/settings.py)
SETTINGS = dict(
    sample_interval=Setting(NOT_NEGATIVE, default=0, doc="print samples every N steps and at the end (0: off)"),
    sample_prompt=Setting(unused=_no_samples, default="Hello, I'm a language model,", doc="what the samples continue"),
    sample_max_tokens=Setting(POSITIVE, unused=_no_samples, default=32, doc="or fewer, to the end-of-text token"),
    sample_top_p=Setting(NUCLEUS, unused=_no_samples, default=1.0, doc="nucleus sampling (e.g. 0.9); 1.0: off"),
    num_samples_train=Setting(POSITIVE, unused=_no_samples, default=4, doc="samples each time"),
    eval_at_start=Setting(unused=lambda c: c['eval_only'] and "eval_only=True evaluates the model it starts from",
                          default=True, doc="False: no evaluation before the first step (step 0's training loss is "
                          "the first reading); the last step's still runs"),
    hellaswag_interval=Setting(NOT_NEGATIVE, default=0, doc="HellaSwag accuracy every N steps and at the end (0: "
                               "off; the data in $HELLASWAG_DIR or ~/.cache/nanogpt/hellaswag)"),
)


EVAL_BAR_DELAY = 3.0  # seconds an evaluation runs before its progress bar appears
EVAL_LINE_EVERY = 10.0  # seconds between an evaluation's progress lines where stderr is no terminal


def all_ranks_mean(value, device):
    """Average a float over the DDP ranks (each its own share of a step); the value itself without DDP."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return t.item() / dist.get_world_size()


@torch.no_grad()
def estimate_loss(model, loader, eval_iters, ctx, device, stop=None, forward=None):
    """Mean loss over eval_iters batches of each split, from loader(split): the same batches at every evaluation and on
    any number of processes, rank r of N evaluating batches r, r+N, ... (docs/monitoring.md#evaluations). stop(), asked
    after each batch on every rank (it may be a collective), abandons the evaluation: the result is then None.
    forward(X, Y), a batch's loss, replaces model(X, Y) under ctx (stepgraph.py's EvalGraph)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    rounds = -(-eval_iters // world)  # every rank runs as many forwards: FSDP gathers the weights in each
    out, progress = {}, Progress(2 * eval_iters, quiet=rank != 0)
    model.eval()
    try:
        for split in ('train', 'val'):
            batches = loader(split)
            losses = torch.zeros(eval_iters, device=device)
            for k in range(rounds * world):
                if k % world != rank:
                    if k < eval_iters:
                        batches.skip()  # another rank's
                    continue
                X, Y = batches.next_batch()  # past eval_iters: a batch whose loss is not counted
                if forward is None:
                    with ctx:
                        _, loss = model(X, Y)
                else:
                    loss = forward(X, Y)
                if k < eval_iters:
                    losses[k] = loss
                progress.update(len(out) * eval_iters + min(k + world - rank, eval_iters))
                if stop is not None and stop():
                    return None
            if world > 1:
                dist.all_reduce(losses)  # each batch's loss from its rank, zeros from the others: exact
            out[split] = losses.mean().item()
    finally:
        progress.bar.close()
        model.train()
    return out


class Progress:
    """An evaluation's progress, on rank 0 only: a tqdm bar after EVAL_BAR_DELAY seconds on a terminal, elsewhere
    a line every EVAL_LINE_EVERY seconds, so a long evaluation does not look like a hung run."""

    def __init__(self, total, quiet=False):
        self.total, self.done, self.start = total, 0, time.time()
        self.terminal, self.lines, self.shown = not quiet and sys.stderr.isatty(), not quiet, self.start
        self.bar = tqdm(total=total, desc="evaluating", unit="batch", delay=EVAL_BAR_DELAY, leave=False,
                        disable=not self.terminal, dynamic_ncols=True)

    def update(self, done):
        """done: the batches evaluated so far, every rank's."""
        self.bar.update(done - self.done)
        self.done, now = done, time.time()
        if self.lines and not self.terminal and now - self.shown >= EVAL_LINE_EVERY:
            self.shown = now
            print(f"evaluating: {done}/{self.total} batches, {duration(now - self.start)}", flush=True)


def draw_samples(model, tokenizer, prompt_ids, num_samples, max_tokens, ctx, device, seed, top_p=None,
                 stop_at_eot=True):
    """num_samples continuations of prompt_ids (top_k 50, nucleus sampling with top_p < 1) from a generator of their own
    (the training's random stream is left alone), decoded, each up to its first new end-of-text token."""
    generator = torch.Generator(device=device).manual_seed(seed)
    eot = tokenizer.eot if stop_at_eot else None
    model.eval()
    with torch.no_grad(), ctx:
        out = model.generate(torch.tensor([prompt_ids] * num_samples, device=device), max_tokens,
                             top_k=50, generator=generator, vocab_limit=tokenizer.vocab_size,
                             top_p=top_p if top_p is not None and top_p < 1 else None, eot=eot)
    model.train()
    return [tokenizer.decode(until_eot(row, eot, len(prompt_ids))) for row in out.tolist()]
