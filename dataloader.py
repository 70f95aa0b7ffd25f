"""
Batches for training and evaluation from a dataset's train.bin / val.bin (see datafiles.py).

RandomWindows is nanoGPT's sampler: each batch is batch_size windows of block_size+1 tokens at random
offsets. The offsets of batch n on a rank come from a random generator seeded with (seed, stream, rank, n),
so the sampler's whole state is the number of batches drawn: the same on every rank, a plain int in the
checkpoint, and a resumed run draws exactly the batches an uninterrupted one would have.
"""
import os

import numpy as np
import torch

from datafiles import open_tokens
from errors import UserError


def check_split(data_dir, split, block_size, vocab_size, dtype, prepare_hint):
    """Validate a split's .bin file before training starts; return its path."""
    path = os.path.join(data_dir, f"{split}.bin")
    if not os.path.exists(path):
        raise UserError(f"{path} not found: prepare the dataset first with `{prepare_hint}`")
    data = open_tokens(path, dtype)
    if len(data) < block_size + 1:
        raise UserError(f"{path} has {len(data)} tokens, too few for block_size={block_size} "
                        f"(need at least {block_size + 1}): lower block_size or use more data")
    # ids past the model's vocabulary would index out of the embedding (a cryptic device-side assert on GPU)
    chunk = 1 << 26
    top = max(int(data[i:i + chunk].max()) for i in range(0, len(data), chunk))
    if top >= vocab_size:
        raise UserError(f"{path} holds token id {top}, beyond the model's vocab_size {vocab_size}: "
                        f"the data was prepared with a different tokenizer; re-run `{prepare_hint}`")
    return path


class RandomWindows:

    def __init__(self, path, batch_size, block_size, device, dtype="uint16", seed=0, rank=0, stream=0):
        self.path, self.batch_size, self.block_size = path, batch_size, block_size
        self.device, self.dtype = torch.device(device), dtype
        self.seed, self.rank, self.stream = seed, rank, stream  # stream: 0 for training, others for evaluation
        self.batches = 0  # batches drawn so far

    def next_batch(self):
        # re-create the memmap every batch: a long-lived one keeps growing the process's memory
        data = open_tokens(self.path, self.dtype)
        rng = np.random.default_rng([self.seed, self.stream, self.rank, self.batches])
        self.batches += 1
        ix = rng.integers(0, len(data) - self.block_size, size=self.batch_size).tolist()
        x = torch.from_numpy(np.stack([data[i:i + self.block_size].astype(np.int64) for i in ix]))
        y = torch.from_numpy(np.stack([data[i + 1:i + 1 + self.block_size].astype(np.int64) for i in ix]))
        if self.device.type == "cuda":
            # pinned host memory lets the copy run asynchronously, overlapping the current step
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def state_dict(self):
        # The state that draws the latest batch again: the training loop always holds one batch it has
        # fetched but not yet used, and a resumed run must start with that batch.
        return {"batches": max(self.batches - 1, 0)}

    def load_state_dict(self, state):
        self.batches = state["batches"]
