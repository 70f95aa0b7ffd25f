"""Batches for training and evaluation from a dataset's train.bin / val.bin or token shards (gpt/data).

RandomWindows is nanoGPT's sampler, random windows of block_size+1 tokens, except that the offsets of step
k's whole global batch come from one generator seeded with (seed, stream, 0, k), rank r's micro-step j taking
the (r * micro_steps + j)-th run of them: every split of the global batch trains on the same windows
(docs/scaling.md), and its state, a count of micro-batches drawn, resumes on any number of processes.
SequentialShards is build-nanogpt's loader (docs/fineweb.md); its state is a position (shard, offset, epoch)."""
import os
import weakref

import numpy as np
import torch

from gpt.data import list_shards, open_shard, open_tokens
from gpt.runtime.errors import UserError


def check_split(data_dir, split, block_size, vocab_size, dtype, prepare_hint):
    path = os.path.join(data_dir, f"{split}.bin")
    if not os.path.exists(path):
        raise UserError(f"{path} not found: prepare the dataset first with `{prepare_hint}`")
    data = open_tokens(path, dtype)
    if len(data) < block_size + 1:
        raise UserError(f"{path} has {len(data)} tokens, too few for block_size={block_size} "
                        f"(need at least {block_size + 1}): lower block_size or use more data")
    check_width(data, dtype, vocab_size, path)
    # ids past the vocabulary would be a cryptic device-side assert on GPU; of a file past 100M tokens only
    # the start is scanned here, as the loaders check every batch
    check_ids(data if len(data) <= 100_000_000 else data[:HEAD], vocab_size, path)
    return path


HEAD = 1_000_000  # tokens at the start of a file that tell its width


def check_width(data, dtype, vocab_size, path):
    """One line for a .bin file of the other token width than dtype (docs/data.md#checks-before-training)."""
    head = np.asarray(data[:HEAD])
    fix = ("set \"dtype\" in the dataset's meta.json to what its prepare script wrote (without meta.json "
           "it is uint16), or prepare it again")
    if dtype == "uint16" and len(data) % 2 == 0 and len(head) >= 64 and head[::2].any() and not head[1::2].any():
        raise UserError(f"{path} looks like uint32 tokens read as uint16 (every second uint16 is 0): {fix}")
    if dtype == "uint32" and vocab_size and int(head.max()) >= vocab_size > int(head.view(np.uint16).max()):
        raise UserError(f"{path} looks like uint16 tokens read as uint32 (as uint32 its ids pass vocab_size "
                        f"{vocab_size}, as uint16 they all fit): {fix}")


def check_ids(tokens, vocab_size, path):
    top = int(tokens.max())
    if vocab_size is not None and top >= vocab_size:
        raise UserError(f"{path} holds token id {top}, beyond the vocabulary's {vocab_size} ids: the data was "
                        f"prepared with another tokenizer (or is damaged); prepare it again")


def make_loader(data_dir, split, batch_size, block_size, device, vocab_size, dtype="uint16", seed=0, rank=0,
                world_size=1, stream=0, prepare_hint="the dataset's prepare.py", micro_steps=1):
    """The batches of one split, its files checked first: a sharded dataset's shards in order, else random
    windows of train.bin / val.bin (micro_steps micro-batches of batch_size a step on each of world_size ranks)."""
    if shards := list_shards(data_dir, split):
        return SequentialShards(shards, batch_size, block_size, device, rank, world_size, vocab_size)
    path = check_split(data_dir, split, block_size, vocab_size, dtype, prepare_hint)
    return RandomWindows(path, batch_size, block_size, device, dtype, seed, rank, stream, vocab_size, world_size,
                         micro_steps)


class TokenFile:
    """A token file mapped once for the run, with a descriptor so that check() catches a change in place (reading past
    the end of a mapped file cut short is a SIGBUS). was: its os.stat at the run's start (a shard's)."""

    def __init__(self, path, open_fn, was=None):
        self.path, self.tokens = path, open_fn(path)  # open_fn checks the file first: one line if it is bad
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise UserError(f"{path} cannot be read ({e.strerror or e}): check its permissions") from None
        weakref.finalize(self, os.close, fd)
        self.fd, self.stat = fd, os.fstat(fd)
        now = self.stat
        if was and (was.st_ino, was.st_size, was.st_mtime_ns) != (now.st_ino, now.st_size, now.st_mtime_ns):
            raise UserError(f"{path} changed since the run started ({was.st_size:,} bytes then, {now.st_size:,} "
                            f"now): a run reads the shards it checked at its start; put the shard back and resume")

    def check(self):
        now = os.fstat(self.fd)
        if (now.st_size, now.st_mtime_ns) != (self.stat.st_size, self.stat.st_mtime_ns):
            raise UserError(f"{self.path} was changed in place while the run read it ({self.stat.st_size:,} bytes at "
                            f"the start, {now.st_size:,} now): put the data back and resume; to change a dataset under "
                            f"a running run, rename the new file over the old one (mv), which the run does not see")
        return self.tokens


def files_changed(was, now):
    return UserError(f"the dataset's files changed since the checkpoint: its run read {was}, this one would read "
                     f"{now}; put back the files the run trained on, or start a new run")


def check_position(state, counts, sizes=()):
    """A checkpoint's data position: whole numbers from 0 under `counts`, from 1 under `sizes` where given, and
    the shards' (name, tokens) where listed; a damaged or hand-edited one is one line."""
    shards = state.get("shards", []) if isinstance(state, dict) else None
    if not (isinstance(state, dict) and all(type(state.get(k)) is int and state[k] >= 0 for k in counts)
            and all(type(state[k]) is int and state[k] > 0 for k in sizes if k in state)
            and isinstance(shards, list) and all(isinstance(s, (list, tuple)) and len(s) == 2
                                                 and isinstance(s[0], str) and type(s[1]) is int for s in shards)):
        raise UserError(f"the checkpoint's data position {str(state)[:120]} is not one the loaders write (whole "
                        f"numbers {', '.join(counts)}): the checkpoint is damaged or was edited")


def to_device(device, x, y):
    """A batch on the device; pinned host memory lets a copy to a GPU overlap the current step."""
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def describe_shards(shards):
    """[(name, tokens), ...] in a few words: '3 shards (a_000001.bin to a_000003.bin, 1,500 tokens)'."""
    names, total = [name for name, _ in shards], sum(n for _, n in shards)
    if len(names) == 1:
        return f"shard {names[0]} ({total:,} tokens)"
    return f"{len(names)} shards ({names[0]} to {names[-1]}, {total:,} tokens)" if names else "no shards"


class RandomWindows:
    def __init__(self, path, batch_size, block_size, device, dtype="uint16", seed=0, rank=0, stream=0, vocab_size=None,
                 world_size=1, micro_steps=1):
        self.path, self.batch_size, self.block_size, self.micro_steps = path, batch_size, block_size, micro_steps
        self.device, self.dtype, self.world_size, self.vocab_size = torch.device(device), dtype, world_size, vocab_size
        self.file = TokenFile(path, lambda p: open_tokens(p, dtype))
        self.seed, self.rank, self.stream = seed, rank, stream  # stream: 0 for training, others for evaluation
        self.batches = 0  # micro-batches this rank has drawn so far

    def next_batch(self):
        data = self.file.check()
        # this rank's micro-batch is a run of the windows of its step's global batch, whose offsets one
        # generator draws (see the module's docstring)
        step, j = divmod(self.batches, self.micro_steps)
        first = (self.rank * self.micro_steps + j) * self.batch_size
        rng = np.random.default_rng([self.seed, self.stream, 0, step])
        self.batches += 1
        everyone = self.world_size * self.micro_steps * self.batch_size  # the step's global batch
        ix = rng.integers(0, len(data) - self.block_size, size=everyone)[first:first + self.batch_size].tolist()
        xy = np.stack([data[i:i + self.block_size + 1].astype(np.int64) for i in ix])
        check_ids(xy, self.vocab_size, self.path)
        x, y = torch.from_numpy(np.ascontiguousarray(xy[:, :-1])), torch.from_numpy(np.ascontiguousarray(xy[:, 1:]))
        return to_device(self.device, x, y)

    def skip(self):
        """Pass over the next batch unread: one another rank takes (docs/monitoring.md#evaluations)."""
        self.batches += 1

    def state_dict(self):
        # The state that draws the latest batch again: the training loop always holds one batch it has
        # fetched but not yet used, and a resumed run must start with that batch.
        return {"batches": max(self.batches - 1, 0), "world_size": self.world_size, "micro_steps": self.micro_steps,
                "file": os.path.basename(self.path), "tokens": len(self.file.tokens)}

    def describe(self):
        return f"{os.path.basename(self.path)} ({len(self.file.tokens):,} tokens)"

    def load_state_dict(self, state):
        if isinstance(state, dict) and "shard" in state:  # a position in token shards: the folder held shards then
            check_position(state, ("shard", "offset", "epoch"))
            raise files_changed(describe_shards(state["shards"]), self.describe())
        check_position(state, ("batches",), ("world_size", "micro_steps", "tokens"))
        if state.get("tokens", len(self.file.tokens)) != len(self.file.tokens):
            print(f"note: the checkpoint's run read {state.get('file', 'a file')} of {state['tokens']:,} tokens, "
                  f"this one {self.describe()}: the resumed run draws its windows from the file as it is now")
        # a run resumed with another split of the global batch (processes, micro-steps) goes on at the step the
        # saved one reached: a checkpoint is written between steps. An older checkpoint has no micro_steps (nor,
        # older still, world_size): its batches were counted per rank and micro-step at one micro-step per step
        if "micro_steps" in state:
            self.batches = state["batches"] // state["micro_steps"] * self.micro_steps
        else:
            self.batches = -(-state["batches"] * state.get("world_size", self.world_size) // self.world_size)


class SequentialShards:
    def __init__(self, paths, batch_size, block_size, device, rank=0, world_size=1, vocab_size=None):
        if not paths:
            raise UserError("no token shards given: prepare the dataset first (e.g. `python data/fineweb/prepare.py`)")
        self.paths, self.batch_size, self.block_size = list(paths), batch_size, block_size
        self.device, self.rank, self.world_size, self.vocab_size = torch.device(device), rank, world_size, vocab_size
        self.step = batch_size * block_size * world_size  # tokens all ranks consume together per batch
        self.shards, self.files = [], []  # (name, tokens) of each shard; os.stat of each when checked
        for path in self.paths:
            # every rank must find its window (block_size+1 tokens per row) in every shard
            n = len(open_shard(path))
            if n < self.step + 1:
                raise UserError(f"{path} has {n} tokens, too few for one batch on all ranks (batch_size*block_size*"
                                f"world_size+1 = {self.step + 1}): lower batch_size or block_size, or remove the shard")
            self.shards.append((os.path.basename(path), n))
            self.files.append(os.stat(path))
        self.shard, self.offset, self.epoch = 0, 0, 0  # where the next batch is drawn from (if it fits)
        self.drawn = None  # (shard, offset, epoch) of the latest batch returned; None before the first
        self.open = None, None  # (shard, TokenFile) being read: one mapped at a time, however many shards

    def tokens(self, shard):
        """The shard's tokens, mapped once while it is read: the file checked when the run started, else one line."""
        if self.open[0] != shard:
            self.open = None, None  # the previous shard's mapping goes first
            self.open = shard, TokenFile(self.paths[shard], open_shard, was=self.files[shard])
        return self.open[1].check()

    def skip(self):
        """Move to the next batch's position and return it, without reading the tokens: next_batch reads
        them, an evaluation passes over a batch another rank takes (docs/monitoring.md#evaluations)."""
        if self.offset + self.step + 1 > self.shards[self.shard][1]:  # the window does not fit for every rank
            self.shard, self.offset = self.shard + 1, 0
            if self.shard == len(self.paths):
                self.shard, self.epoch = 0, self.epoch + 1
        self.drawn = (self.shard, self.offset, self.epoch)
        self.offset += self.step
        return self.drawn

    def next_batch(self):
        shard, offset, _ = self.skip()
        data = self.tokens(shard)
        B, T = self.batch_size, self.block_size
        start = offset + self.rank * B * T
        buf = torch.from_numpy(data[start:start + B * T + 1].astype(np.int64))
        check_ids(buf, self.vocab_size, self.paths[shard])
        return to_device(self.device, buf[:-1].view(B, T), buf[1:].view(B, T))

    def state_dict(self):
        # the position that draws the latest batch again, as RandomWindows' state does
        shard, offset, epoch = self.drawn or (self.shard, self.offset, self.epoch)
        return {"shard": shard, "offset": offset, "epoch": epoch, "shards": [list(s) for s in self.shards]}

    def load_state_dict(self, state):
        if isinstance(state, dict) and "batches" in state:  # RandomWindows' state: the folder held train.bin then
            check_position(state, ("batches",), ("tokens",))
            raise files_changed(f"{state.get('file', 'train.bin')}" + (f" ({state['tokens']:,} tokens)"
                                if "tokens" in state else ""), describe_shards(self.shards))
        check_position(state, ("shard", "offset", "epoch"))
        saved = [tuple(s) for s in state.get("shards", self.shards)]  # older checkpoints do not list them
        if saved != self.shards:
            raise files_changed(describe_shards(saved), describe_shards(self.shards))
        if not 0 <= state["shard"] < len(self.paths):
            raise UserError(f"the checkpoint's data position is in shard {state['shard']}, but there are only "
                            f"{len(self.paths)} shards: the dataset is not the one the run was trained on")
        self.shard, self.offset, self.epoch = state["shard"], state["offset"], state["epoch"]
        self.drawn = None
