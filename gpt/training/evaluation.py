"""
Evaluation during training (train.py): the mean loss of each split over fixed batches, averaged over the
DDP ranks, and a few sampled continuations of a prompt.
"""
import torch
import torch.distributed as dist
from tqdm import tqdm

from gpt.generation import until_eot
from gpt.runtime.settings import NOT_NEGATIVE, NUCLEUS, POSITIVE, Setting


def _no_samples(c):
    return c['sample_interval'] == 0 and "sample_interval=0 draws no samples during training"


# train.py's settings for what it evaluates besides the loss, set like train.py's own (gpt/runtime/settings.py)
SETTINGS = dict(
    sample_interval=Setting(NOT_NEGATIVE, default=0, doc="print samples every N steps and at the end (0: off)"),
    sample_prompt=Setting(unused=_no_samples, default="Hello, I'm a language model,", doc="what the samples continue"),
    sample_max_tokens=Setting(POSITIVE, unused=_no_samples, default=32, doc="or fewer, to the end-of-text token"),
    sample_top_p=Setting(NUCLEUS, unused=_no_samples, default=1.0, doc="nucleus sampling (e.g. 0.9); 1.0: off"),
    num_samples_train=Setting(POSITIVE, unused=_no_samples, default=4, doc="samples each time"),
    hellaswag_interval=Setting(NOT_NEGATIVE, default=0, doc="HellaSwag accuracy every N steps and at the end (0: "
                               "off; the data in $HELLASWAG_DIR or ~/.cache/nanogpt/hellaswag)"),
)


EVAL_BAR_DELAY = 3.0  # seconds an evaluation runs before its progress bar appears


def all_ranks_mean(value, device):
    """Average a float over the DDP ranks (each evaluated its own batches); the value itself without DDP."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return t.item() / dist.get_world_size()


@torch.no_grad()
def estimate_loss(model, loader, eval_iters, ctx, device):
    """Mean loss over eval_iters batches of each split, from loader(split) - made afresh each time, with a
    fixed seed, so the batches are the same at every evaluation and successive values compare the model,
    not the luck of the draw."""
    out = {}
    model.eval()
    # a bar once the evaluation has taken EVAL_BAR_DELAY seconds (a CPU, a large eval_iters), on rank 0, and
    # only when stderr is a terminal (disable=None); it goes away when done (leave=False)
    quiet = dist.is_available() and dist.is_initialized() and dist.get_rank() != 0
    with tqdm(total=2 * eval_iters, desc="evaluating", unit="batch", delay=EVAL_BAR_DELAY, leave=False,
              disable=True if quiet else None, dynamic_ncols=True) as bar:
        for split in ('train', 'val'):
            batches = loader(split)
            losses = torch.zeros(eval_iters, device=device)
            for k in range(eval_iters):
                X, Y = batches.next_batch()
                with ctx:
                    _, loss = model(X, Y)
                losses[k] = loss
                bar.update()
            out[split] = all_ranks_mean(losses.mean().item(), device)
    model.train()
    return out


def draw_samples(model, tokenizer, prompt_ids, num_samples, max_tokens, ctx, device, seed, top_p=None,
                 stop_at_eot=True):
    """num_samples continuations of prompt_ids (top_k 50, and nucleus sampling with top_p < 1), from a
    generator of their own, so sampling never changes the training's random stream; the decoded texts, each
    up to its first new end-of-text token where the tokenizer has one (and stop_at_eot)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    eot = tokenizer.eot if stop_at_eot else None
    model.eval()
    with torch.no_grad(), ctx:
        out = model.generate(torch.tensor([prompt_ids] * num_samples, device=device), max_tokens,
                             top_k=50, generator=generator, vocab_limit=tokenizer.vocab_size,
                             top_p=top_p if top_p is not None and top_p < 1 else None, eot=eot)
    model.train()
    return [tokenizer.decode(until_eot(row, eot, len(prompt_ids))) for row in out.tolist()]
