"""
Batches for training and evaluation from a dataset's train.bin / val.bin (see gpt/data.py).

RandomWindows is nanoGPT's sampler: each micro-batch is windows of block_size+1 tokens at random offsets.
The offsets of optimizer step k's whole global batch (all ranks' micro-batches together) come from one random
generator seeded with (seed, stream, 0, k); rank r's micro-step j takes its run of them, the
(r * micro_steps + j)-th micro_batch. So a step reads the same windows however the global batch is split:
one GPU with 2 micro-steps of 32, two GPUs with 1 of 32 each, four with 1 of 16 (gpt/schedule.py's
split_batch) train on the same global batch, the same curve up to the order of the sums, not merely a
statistically equal one. The sampler's whole state is the number of micro-batches a rank has drawn (at a
checkpoint, a whole number of steps), with the split it counted in: a plain int in the checkpoint, and a
resumed run draws exactly the batches an uninterrupted one would have, on any number of processes.

SequentialShards is build-nanogpt's loader over token shards (data.open_shard: llm.c-style .bin shards or
build-nanogpt's own .npy ones, found by data.list_shards in the same folder): it walks the shards in
order, each step taking the next batch_size*block_size*world_size tokens, rank r the r-th slice of them, so
over an epoch every token is read once by one rank. Its state is a position (shard, offset, epoch), also the
same on every rank.
"""
import os

import numpy as np
import torch

from gpt.data import list_shards, open_shard, open_tokens
from gpt.errors import UserError


def check_split(data_dir, split, block_size, vocab_size, dtype, prepare_hint):
    """Validate a split's .bin file before training starts; return its path."""
    path = os.path.join(data_dir, f"{split}.bin")
    if not os.path.exists(path):
        raise UserError(f"{path} not found: prepare the dataset first with `{prepare_hint}`")
    data = open_tokens(path, dtype)
    if len(data) < block_size + 1:
        raise UserError(f"{path} has {len(data)} tokens, too few for block_size={block_size} "
                        f"(need at least {block_size + 1}): lower block_size or use more data")
    # ids past the model's vocabulary would index out of the embedding (a cryptic device-side assert on GPU).
    # Scan files up to 100M tokens whole (a fraction of a second); the loaders check every batch anyway.
    if len(data) <= 100_000_000:
        check_ids(data, vocab_size, path)
    return path


def check_ids(tokens, vocab_size, path):
    top = int(tokens.max())
    if vocab_size is not None and top >= vocab_size:
        raise UserError(f"{path} holds token id {top}, beyond the vocabulary's {vocab_size} ids: the data was "
                        f"prepared with another tokenizer (or is damaged); prepare it again")


def make_loader(data_dir, split, batch_size, block_size, device, vocab_size, dtype="uint16", seed=0, rank=0,
                world_size=1, stream=0, prepare_hint="the dataset's prepare.py", micro_steps=1):
    """The batches of one split: in order over the shards of a sharded dataset (each token once per epoch),
    random windows of train.bin / val.bin otherwise (micro_steps micro-batches of batch_size a step on each
    of world_size ranks). The files are checked first."""
    shards = list_shards(data_dir, split)
    if shards:
        return SequentialShards(shards, batch_size, block_size, device, rank, world_size, vocab_size)
    path = check_split(data_dir, split, block_size, vocab_size, dtype, prepare_hint)
    return RandomWindows(path, batch_size, block_size, device, dtype, seed, rank, stream, vocab_size, world_size,
                         micro_steps)


class RandomWindows:

    def __init__(self, path, batch_size, block_size, device, dtype="uint16", seed=0, rank=0, stream=0, vocab_size=None,
                 world_size=1, micro_steps=1):
        self.path, self.batch_size, self.block_size, self.vocab_size = path, batch_size, block_size, vocab_size
        self.device, self.dtype = torch.device(device), dtype
        self.seed, self.rank, self.stream = seed, rank, stream  # stream: 0 for training, others for evaluation
        self.world_size, self.micro_steps = world_size, micro_steps
        self.batches = 0  # micro-batches this rank has drawn so far

    def windows(self, n):
        """(step, first, last): this rank's micro-batch n is windows first..last-1 of that step's global batch,
        whose offsets one generator draws (see the module's docstring)."""
        step, j = divmod(n, self.micro_steps)
        first = (self.rank * self.micro_steps + j) * self.batch_size
        return step, first, first + self.batch_size

    def next_batch(self):
        # re-create the memmap every batch: a long-lived one keeps growing the process's memory
        data = open_tokens(self.path, self.dtype)
        step, first, last = self.windows(self.batches)
        rng = np.random.default_rng([self.seed, self.stream, 0, step])
        self.batches += 1
        everyone = self.world_size * self.micro_steps * self.batch_size  # the step's global batch
        ix = rng.integers(0, len(data) - self.block_size, size=everyone)[first:last].tolist()
        xy = np.stack([data[i:i + self.block_size + 1].astype(np.int64) for i in ix])
        check_ids(xy, self.vocab_size, self.path)
        x, y = torch.from_numpy(np.ascontiguousarray(xy[:, :-1])), torch.from_numpy(np.ascontiguousarray(xy[:, 1:]))
        if self.device.type == "cuda":
            # pinned host memory lets the copy run asynchronously, overlapping the current step
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def state_dict(self):
        # The state that draws the latest batch again: the training loop always holds one batch it has
        # fetched but not yet used, and a resumed run must start with that batch.
        return {"batches": max(self.batches - 1, 0), "world_size": self.world_size, "micro_steps": self.micro_steps}

    def load_state_dict(self, state):
        # a run resumed with another split of the global batch (processes, micro-steps) goes on at the step the
        # saved one reached: a checkpoint is written between steps. An older checkpoint has no micro_steps (nor,
        # older still, world_size): its batches were counted per rank and micro-step at one micro-step per step
        saved_steps, saved_world = state.get("micro_steps", 1), state.get("world_size", self.world_size)
        if "micro_steps" in state:
            self.batches = state["batches"] // saved_steps * self.micro_steps
        else:
            self.batches = -(-state["batches"] * saved_world // self.world_size)


class SequentialShards:

    def __init__(self, paths, batch_size, block_size, device, rank=0, world_size=1, vocab_size=None):
        if not paths:
            raise UserError("no token shards given: prepare the dataset first (e.g. `python data/fineweb/prepare.py`)")
        self.paths, self.batch_size, self.block_size = list(paths), batch_size, block_size
        self.device, self.rank, self.world_size = torch.device(device), rank, world_size
        self.vocab_size = vocab_size
        self.step = batch_size * block_size * world_size  # tokens all ranks consume together per batch
        for path in self.paths:
            # every rank must find its window (block_size+1 tokens per row) in every shard
            n = len(open_shard(path))
            if n < self.step + 1:
                raise UserError(f"{path} has {n} tokens, too few for one batch on all ranks (batch_size*block_size*"
                                f"world_size+1 = {self.step + 1}): lower batch_size or block_size, or remove the shard")
        self.shard, self.offset, self.epoch = 0, 0, 0  # where the next batch is drawn from (if it fits)
        self.drawn = None  # (shard, offset, epoch) of the latest batch returned; None before the first

    def next_batch(self):
        # re-create the memmap every batch: a long-lived one keeps growing the process's memory
        data = open_shard(self.paths[self.shard])
        if self.offset + self.step + 1 > len(data):  # the window does not fit for every rank: next shard
            self.shard, self.offset = self.shard + 1, 0
            if self.shard == len(self.paths):
                self.shard, self.epoch = 0, self.epoch + 1
            data = open_shard(self.paths[self.shard])
        self.drawn = (self.shard, self.offset, self.epoch)
        B, T = self.batch_size, self.block_size
        start = self.offset + self.rank * B * T
        buf = data[start:start + B * T + 1].astype(np.int64)
        check_ids(buf, self.vocab_size, self.paths[self.shard])
        buf = torch.from_numpy(buf)
        self.offset += self.step
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        if self.device.type == "cuda":
            # pinned host memory lets the copy run asynchronously, overlapping the current step
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def state_dict(self):
        # The position that draws the latest batch again: the training loop always holds one batch it has
        # fetched but not yet used, and a resumed run must start with that batch.
        shard, offset, epoch = self.drawn or (self.shard, self.offset, self.epoch)
        return {"shard": shard, "offset": offset, "epoch": epoch}

    def load_state_dict(self, state):
        if not 0 <= state["shard"] < len(self.paths):
            raise UserError(f"the checkpoint's data position is in shard {state['shard']}, but there are only "
                            f"{len(self.paths)} shards: the dataset is not the one the run was trained on")
        self.shard, self.offset, self.epoch = state["shard"], state["offset"], state["epoch"]
        self.drawn = None
