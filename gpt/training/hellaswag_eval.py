"""HellaSwag scoring, as hellaswag.py describes it (with reference numbers): the data file (load_examples) and the
batched, DDP-shared evaluation (evaluate), used by hellaswag.py and, during training, by train.py."""
import json
import os
import urllib.request
from contextlib import nullcontext

import torch
import torch.distributed as dist
from tqdm import tqdm

from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write

_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_{split}.jsonl"


def _parse(text, where):
    """The examples of a jsonl text, each checked for what scoring needs: ctx, 4 endings, a label 0-3."""
    examples = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{where} line {i} is not JSON: is this HellaSwag's official jsonl file?")
        endings = example.get("endings") if isinstance(example, dict) else None
        if (not isinstance(endings, list) or len(endings) != 4 or not all(isinstance(e, str) for e in endings)
                or not isinstance(example.get("ctx"), str) or example.get("label") not in (0, 1, 2, 3)):
            raise UserError(f"{where} line {i} is not a HellaSwag example (needs ctx, 4 endings and a label 0-3)")
        examples.append(example)
    if not examples:
        raise UserError(f"{where} holds no examples")
    return examples


def _download(split, file):
    """Fetch the official jsonl, check it, and keep a copy in `file` (written atomically)."""
    url, folder = _URL.format(split=split), os.path.dirname(os.path.abspath(file))
    print(f"downloading HellaSwag {split} from {url} to {file}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
        examples = _parse(data.decode("utf-8"), url)
    except (OSError, ValueError, UserError) as e:  # URLError, HTTPError and timeouts are OSErrors
        reason = (str(getattr(e, "reason", e)) or type(e).__name__).splitlines()[0][:200]
        raise UserError(f"could not download HellaSwag ({reason}): put hellaswag_{split}.jsonl in {folder} "
                        f"or pass its path")
    try:
        os.makedirs(folder, exist_ok=True)
        with atomic_write(file) as f:
            f.write(data)
    except OSError as e:
        print(f"warning: could not keep a copy of HellaSwag in {file} ({e.strerror or e}); it will be "
              f"downloaded again next time")
    return examples


def load_examples(path=None, split="val"):
    """HellaSwag's examples (dicts with ctx, endings, label) from the file `path`, else hellaswag_<split>.jsonl in the
    folder `path`, $HELLASWAG_DIR or ~/.cache/nanogpt/hellaswag, downloaded if missing."""
    if split not in ("train", "val"):
        raise UserError(f"unknown HellaSwag split '{split}': use val or train (test has no labels)")
    file = path
    if not (path and (os.path.isfile(path) or path.endswith(".jsonl"))):
        folder = path or os.environ.get("HELLASWAG_DIR") or os.path.expanduser("~/.cache/nanogpt/hellaswag")
        file = os.path.join(folder, f"hellaswag_{split}.jsonl")
    if not os.path.exists(file):
        if file == path:
            raise UserError(f"no HellaSwag file at {path}: give the path of hellaswag_{split}.jsonl or its folder")
        return _download(split, file)
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{file} could not be read ({getattr(e, 'strerror', None) or e})")
    return _parse(text, file)


def render_example(example, tokenizer):
    """tokens (4, L): the context followed by each ending, right-padded with 0; mask (4, L): 1 over the ending's
    tokens (the scored ones); and the label. Endings get a leading space, as GPT-2's BPE tokenizes a word after one."""
    ctx = tokenizer.encode(example["ctx"])
    endings = [tokenizer.encode(" " + ending) for ending in example["endings"]]
    width = max(len(ctx) + len(end) for end in endings)
    tokens, mask = torch.zeros(4, width, dtype=torch.long), torch.zeros(4, width, dtype=torch.long)
    for i, end in enumerate(endings):
        tokens[i, :len(ctx) + len(end)] = torch.tensor(ctx + end, dtype=torch.long)
        mask[i, len(ctx):len(ctx) + len(end)] = 1
    return tokens, mask, int(example["label"])


def score(losses, mask):
    """The predicted endings from per-position losses (..., 4, T), counted where mask is 1: the lowest
    total loss (acc) and the lowest loss per token (acc_norm, which does not favour short endings)."""
    mask = mask.to(torch.float32)
    total = (losses.float() * mask).sum(-1)
    return total.argmin(-1), (total / mask.sum(-1).clamp(min=1)).argmin(-1)


def _collate(rendered, n_rows, block_size, pad_multiple):
    """One batch of n_rows rows (past the examples': padding): inputs (n_rows, T) and targets, the next token over the
    endings and -1 elsewhere. A row's last token is only a target, so a row may hold block_size + 1 tokens; a longer one
    loses its first (the context is cut, the ending kept). T is rounded up to pad_multiple: few shapes to compile."""
    rows = []
    for tokens, mask, _ in rendered:
        lengths = mask.size(1) - mask.flip(1).argmax(1)  # every row ends with its ending
        for tok, msk, n in zip(tokens, mask, lengths.tolist()):
            start = max(0, n - block_size - 1)
            rows.append((tok[start:n], msk[start:n]))
    longest = max(len(tok) for tok, _ in rows) - 1
    T = min(max(1, -(-longest // pad_multiple)) * pad_multiple, block_size)
    tokens, mask = torch.zeros(n_rows, T + 1, dtype=torch.long), torch.zeros(n_rows, T + 1, dtype=torch.long)
    for i, (tok, msk) in enumerate(rows):
        tokens[i, :len(tok)] = tok
        mask[i, :len(msk)] = msk
    return tokens[:, :-1], torch.where(mask[:, 1:] == 1, tokens[:, 1:], -1)


def evaluate(model, examples, tokenizer, device, autocast_ctx, rank=0, world_size=1, batch_examples=8,
             pad_multiple=64, progress=False, stop=None):
    """HellaSwag accuracy: dict(acc, acc_norm, n), example i scored by rank i % world_size. Pass the model without its
    DDP wrapper (a compiled one is fine): ranks run different numbers of forwards. stop(), asked after each batch every
    rank runs (it may be a collective), abandons it: the result is then None."""
    mine = examples[rank::world_size]
    common = -(-len(examples[world_size - 1::world_size]) // batch_examples)  # the last rank's count is the least
    # correct (acc), correct (acc_norm), examples: summed on the device, so the loop never waits for it
    counts = torch.tensor([0, 0, len(mine)], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        starts = range(0, len(mine), batch_examples)
        with (torch.no_grad(), autocast_ctx or nullcontext(),
              tqdm(starts, desc="hellaswag", leave=False, disable=None if progress and rank == 0 else True) as bar):
            for j, i in enumerate(bar):
                rendered = [render_example(example, tokenizer) for example in mine[i:i + batch_examples]]
                x, y = _collate(rendered, 4 * batch_examples, model.config.block_size, pad_multiple)
                x, y = x.to(device), y.to(device)
                _, losses = model(x, y, reduction="none")
                n, T = 4 * len(rendered), y.size(1)
                pred, pred_norm = score(losses[:n].view(-1, 4, T), (y[:n] != -1).view(-1, 4, T))
                labels = torch.tensor([label for _, _, label in rendered], device=device)
                counts[0] += (pred == labels).sum()
                counts[1] += (pred_norm == labels).sum()
                if stop is not None and j < common and stop():
                    return None
    finally:
        model.train(was_training)
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts)
    correct, correct_norm, n = counts.tolist()
    return dict(acc=correct / n if n else float("nan"), acc_norm=correct_norm / n if n else float("nan"), n=n)
