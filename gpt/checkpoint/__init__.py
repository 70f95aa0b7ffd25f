"""Checkpoints (docs/checkpoints.md): nanoGPT's ckpt.pt layout plus what an exact resume needs, written atomically,
CRC-checked on load and read with weights_only=True. What a run saves and when (Saver), resuming, and models built from
checkpoints. Sharded (fsdp) checkpoints: sharded.py; the run's folder and its lock: rundir.py."""
import copy
import math
import os
import random
import re
import shutil
import zipfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from gpt.checkpoint import rundir, sharded
from gpt.checkpoint.sharded import DCP_DIR, TRAIN_STATE, convert_sharded, newer_sharded, save_sharded  # noqa: F401
from gpt.data import GPT2_VOCAB, dataset_dir, read_meta
from gpt.data.tokenizer import folder_meta
from gpt.optim import load_state
from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write
from gpt.runtime.untrusted import first_non_finite, safe_load
from model import GPT, GPTConfig

# how far above the best val loss so far (in nats) a loss that is also above the untrained model's counts as
# divergence: docs/checkpoints.md#numerical-faults says why 1 nat
DIVERGENCE_MARGIN = 1.0
# prefixes that torch.compile (_orig_mod.) and DDP (module.) put in front of parameter names
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")
# where a run whose ckpt.pt holds the best val loss's weights keeps them when a later step's save replaces it
BEST_NAME = "ckpt-best.pt"


def distributed():
    return dist.is_available() and dist.is_initialized()


def is_master():
    return not distributed() or dist.get_rank() == 0


# --- writing

def write_checkpoint(ckpt, path, before_replace=None):
    """Write atomically: None once the file is in place, else why not, said in one line, the previous file kept
    (before_replace: atomic_write's)."""
    folder, name = os.path.split(os.path.abspath(path))
    for stale in os.listdir(folder):  # temp files of saves a kill -9 cut short, each a whole checkpoint
        if stale.startswith(name + ".") and stale.endswith(".tmp"):
            with suppress(OSError):  # a read-only folder: the save below says so
                os.remove(os.path.join(folder, stale))
    try:
        with atomic_write(path, before_replace=before_replace) as f:
            torch.save(ckpt, f)
        return None
    except (OSError, RuntimeError) as e:
        # torch's zip writer raises a RuntimeError that chains the OSError, or names none (a short write)
        cause = next((err for err in (e, e.__cause__, e.__context__) if isinstance(err, OSError)), None)
        if cause is not None:
            reason = cause.strerror or str(cause)
        elif "inline_container" in str(e) or "PytorchStreamWriter" in str(e):
            reason = "the file could not be written whole: " + str(e).strip().splitlines()[0][:120]
        else:
            raise  # not a failure to write: a bug, with its traceback
        print(f"error: could not save checkpoint to {path} ({reason}); the previous checkpoint is kept")
        return f"{path}: {reason}"


def host_copy(obj, storages, reuse):
    """obj (dicts, lists and tuples of tensors and plain values) with every tensor copied to the CPU as it is now,
    tensors that shared memory (tied weights) sharing it still: what a background write saves while the steps
    go on changing the originals in place, CPU ones too. storages: filled with the copies, by (device, address,
    size); reuse: an earlier call's, written over, not allocated again (its memory is mapped: no page faults)."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = (storage.device, storage.data_ptr(), storage.nbytes())
        if key not in storages:
            storages[key] = (reuse.get(key) or torch.UntypedStorage(storage.nbytes())).copy_(storage)
        return torch.empty(0, dtype=obj.dtype).set_(storages[key], obj.storage_offset(), obj.size(), obj.stride())
    if isinstance(obj, dict):
        out = copy.copy(obj)  # the same type, with what it carries beside the items (a state_dict's _metadata)
        out.update((k, host_copy(v, storages, reuse)) for k, v in obj.items())
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v, storages, reuse) for v in obj)
    return obj


def portable(optimizer_state):
    """An optimizer state_dict as an eager run keeps it (stepgraph.py's CUDA graph makes lr a tensor and sets
    capturable), so that any checkpoint resumes anywhere, on a CPU too."""
    for group in optimizer_state["param_groups"]:
        group["lr"], group["capturable"] = float(group["lr"]), False
    return optimizer_state


def keep_numbered_copy(path, iter_num, keep):
    """Besides ckpt.pt, keep the last `keep` checkpoints as ckpt-<iter>.pt (hard links: no extra disk)."""
    name = f"ckpt-{iter_num:07d}.pt"
    if copy_file(path, os.path.dirname(path), name):
        prune_checkpoints(os.path.dirname(path), name, keep)


def copy_file(path, folder, name):
    """folder/name as a hard link to path (a copy where the file system has none); returns whether it is there."""
    copy = os.path.join(folder, name)
    try:
        if os.path.lexists(copy):  # a link there too (even one to nothing): removed, never written through
            os.remove(copy)
        try:
            os.link(path, copy)
        except OSError:  # file systems without hard links
            with open(path, "rb") as src, atomic_write(copy) as dst:
                shutil.copyfileobj(src, dst)
        return True
    except OSError as e:
        print(f"error: could not keep a copy of {path} as {copy} ({e.strerror or e})")
        return False


def remove(path, what):
    try:
        with suppress(FileNotFoundError):
            os.remove(path)
    except OSError as e:
        print(f"error: could not remove {what} {path} ({e.strerror or e})")


def prune_checkpoints(folder, name, keep):
    """Keep only the last `keep` .pt files of name's kind (name up to its first digit), by number: tok900 < tok1000."""
    kind = re.compile(re.escape(re.match(r"\D*", name).group()) + r"(\d+).*\.pt")
    copies = sorted((int(m.group(1)), f) for f in os.listdir(folder) if (m := kind.fullmatch(f)))
    for _, old in copies[:-keep]:
        remove(os.path.join(folder, old), "the old checkpoint")


def rng_state():
    """This process's random generators as tensors and plain types (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def gather_rng_states():
    """Every rank's random state, in rank order (every rank must call this)."""
    if not distributed():
        return [rng_state()]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


# --- what a run saves, and when

def divergence(iter_num, val_loss, best_val_loss, initial_val_loss):
    """Why a val loss says the weights are broken, in words, or None (docs/checkpoints.md#numerical-faults)."""
    if not math.isfinite(val_loss):
        return f"the val loss at step {iter_num} is {val_loss}"
    initial = initial_val_loss if initial_val_loss is not None else val_loss
    ceiling = max(initial, min(best_val_loss, initial) + DIVERGENCE_MARGIN)
    if val_loss <= ceiling:
        return None
    return (f"the val loss at step {iter_num} is {val_loss:.4g}, above {ceiling:.4f}: the untrained model's "
            f"({initial:.4f}) or the best so far + {DIVERGENCE_MARGIN:g}, whichever is larger: the weights "
            f"have diverged")


def due(iter_num, due, val_loss, best_val_loss, eval_only, always_save_checkpoint, checkpoint_interval):
    """The checkpoints due now (`due`: schedule.due's answer): None for ckpt.pt, a file name for one kept beside it."""
    if eval_only or iter_num == 0:
        return []
    saves = []
    if checkpoint_interval > 0 and due.checkpoint:
        saves.append(None)
    if checkpoint_interval == 0 and val_loss is not None and (val_loss < best_val_loss or always_save_checkpoint):
        saves.append(None)
    if due.tokens:
        saves.append(f"ckpt-tok{due.tokens}-val{val_loss:.4f}.pt")
    return saves


class Saver:
    """A run's own checkpoints: the last good one (good: path, iter_num), why its weights are broken (diverged) or
    its last save failed, whose out_dir it is (claim: rank 0's rundir.Claim). resumed: load_for_resume's, or None.
    background (async_save): rank 0 writes each checkpoint from a thread, from a host copy, one at a time."""

    def __init__(self, out_dir, claim=None, resumed=None, keep_best=False, background=False):
        self.out_dir, self.claim, self.pending = out_dir, claim, None  # pending: the write under way (a Future)
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint") if background else None
        self.host = {}  # the last save's host copies, by storage: the next one writes over them once it is written
        self.good = self.initial_val_loss = self.diverged = self.save_failed = self.new_best = None
        # keep_best: ckpt.pt is the best val loss's weights (always_save_checkpoint=False), so a save of a later
        # step (a stop's) first keeps them as BEST_NAME; best: (file name, step) holding them, where known
        self.keep_best, self.best = keep_best, None
        if resumed is not None:
            self.good = (resumed['path'], resumed.get('iter_num', 0))
            self.best = tuple(resumed['best_checkpoint']) if resumed.get('best_checkpoint') else None
            # a checkpoint that does not record it (nanoGPT's): an untrained model's loss is ln(vocab_size)
            self.initial_val_loss = resumed.get('initial_val_loss') or math.log(resumed['model_args']['vocab_size'])

    def record_eval(self, iter_num, val_loss, best_val_loss):
        """Judge the weights by this eval (best_val_loss: the best before); a new run's first is the untrained one's."""
        if self.initial_val_loss is None and math.isfinite(val_loss):
            self.initial_val_loss = val_loss
        self.new_best = iter_num if val_loss < best_val_loss else self.new_best
        self.diverged = divergence(iter_num, val_loss, best_val_loss, self.initial_val_loss)
        if self.diverged and is_master():
            print(f"step {iter_num}: not saving a checkpoint: {self.diverged}")

    def to_save(self, *args):
        if self.pending is not None and self.pending.done():
            self.wait()  # a write that ended in an error that stops the run (out_dir taken) stops it now
        return [] if self.diverged else due(*args)

    def wait(self):
        """Until the background write (if any) has ended: whether it was written (None: none), its error raised."""
        pending, self.pending = self.pending, None
        return pending.result() if pending is not None else None

    def save(self, model, optimizer, sharded=False, name=None, keep=0, **state):
        """Every rank calls this. Sharded: each rank writes its part of out_dir/ckpt_dcp/; else rank 0 writes
        ckpt.pt (or <name>), keeping the last `keep`. Returns whether it was written, or in the background whether
        it is being written (False on ranks > 0)."""
        self.wait()  # one write at a time, in order
        self.check_owner()
        if self.diverged:
            if is_master():
                print(f"not saving a checkpoint: {self.diverged} ({self.last_good()})")
            return False
        state = {**state, "initial_val_loss": self.initial_val_loss, "rng": gather_rng_states()}
        last_check = partial(self.check_owner, broadcast=False, wait=False)  # writing takes seconds: asked again
        if sharded:
            save_sharded(self.out_dir, model, optimizer, state, before_replace=last_check)
            self.good = (os.path.join(self.out_dir, DCP_DIR), state["iter_num"])
            return True
        saved = is_master() and self.write(model, optimizer, name, keep, state, last_check)
        if distributed():
            dist.barrier()
        return saved

    def check_owner(self, broadcast=True, wait=True):
        """Stop the run (UserError) if out_dir is no longer its own; rank 0's claim answers for every rank."""
        problem = self.claim.owner_problem() if self.claim is not None else None
        if broadcast and distributed():
            box = [problem]
            dist.broadcast_object_list(box, src=0)
            problem = box[0]
        if problem:
            raise UserError(f"not saving to {self.out_dir}: {problem}; this run stops so as not to write over "
                            f"that run's files ({self.last_good(wait)})")

    def write(self, model, optimizer, name, keep, state, last_check):
        """Rank 0's part of an unsharded save; returns whether it was written."""
        path = os.path.join(self.out_dir, name or "ckpt.pt")
        model_sd = model.state_dict()
        if (bad := first_non_finite(model_sd)) is not None:
            print(f"error: not saving checkpoint {path}: weight {bad} holds NaN or inf ({self.last_good()})")
            return False
        best_now = name is None and self.keep_best and self.new_best == state["iter_num"]
        if name is None and self.keep_best and not best_now and self.best and self.best[0] == "ckpt.pt":
            self.best = (BEST_NAME, self.best[1]) if copy_file(path, self.out_dir, BEST_NAME) else None
        print(f"saving checkpoint to {path}")
        best = ("ckpt.pt", state["iter_num"]) if best_now else self.best
        ckpt = {"model": model_sd, "optimizer": portable(optimizer.state_dict()), **state, "best_checkpoint": best}
        if self.writer is None:
            return self.put_in_place(ckpt, path, name, keep, best_now, best, last_check)
        self.host, reuse = {}, self.host
        ckpt = host_copy(ckpt, self.host, reuse)
        self.pending = self.writer.submit(self.put_in_place, ckpt, path, name, keep, best_now, best, last_check)
        return True

    def put_in_place(self, ckpt, path, name, keep, best_now, best, last_check):
        """write's second half, from the checkpoint as it is to be saved: the file written, then the records."""
        self.save_failed = write_checkpoint(ckpt, path, before_replace=last_check)
        if self.save_failed:
            return False
        if best_now and self.best and self.best[0] == BEST_NAME:  # ckpt.pt is the best again: no stale copy
            remove(os.path.join(self.out_dir, BEST_NAME), "the earlier best checkpoint")
        self.best = best
        if name is None:
            self.good = (path, ckpt["iter_num"])
            if keep > 0:
                keep_numbered_copy(path, ckpt["iter_num"], keep)
        elif keep > 0:
            prune_checkpoints(self.out_dir, name, keep)
        return True

    def best_file(self):
        """(path, step) of the checkpoint holding the best val loss's weights, where known."""
        return self.best and (os.path.join(self.out_dir, self.best[0]), self.best[1])

    def last_good(self, wait=True):
        """The checkpoint to go back to, in words: the last this run wrote or resumed from (wait: once writes end)."""
        if wait:
            self.wait()
        if self.good is not None:
            return f"the last good checkpoint is {self.good[0]}, from step {self.good[1]}"
        path = os.path.join(self.out_dir, "ckpt.pt")
        if os.path.exists(path):
            return f"{path} was not written by this run"
        earlier = rundir.earlier_runs(self.out_dir)
        return f"there is no good checkpoint: this run wrote none to {self.out_dir}" + (
            f" (an earlier run's is kept in {earlier[0]})" if earlier else "")

    def check_end(self):
        """One error line (status 2) at the end of a run whose last save failed or whose weights are broken."""
        self.wait()
        if self.save_failed:
            raise UserError(f"the run's last checkpoint could not be saved ({self.save_failed}); {self.last_good()}")
        if self.diverged:
            raise UserError(f"the run ended with broken weights, not saved ({self.diverged}); {self.last_good()}. "
                            f"Try a lower learning_rate, or check the data")


# --- reading

def load_checkpoint(path):
    """Read a checkpoint onto the CPU, its checksums checked, refusing anything that is not plain data."""
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}: {where_else(path)}")
    if damage := checksum_failure(path):
        raise UserError(f"{path} is corrupted: {damage}, so its contents are not what was saved (a disk, "
                        f"memory or copy error); {way_back(path)}")
    ckpt = safe_load(path)
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UserError(f"{path} is not a GPT checkpoint (no 'model' and 'model_args' entries)")
    check_entries(ckpt, path)
    ckpt["model"] = clean_state_dict(ckpt["model"])
    if bad := first_non_finite(ckpt["model"]):
        raise UserError(f"{path}: weight {bad} holds NaN or inf, so the model cannot sample or train (the run "
                        f"diverged before this was saved, or the file was damaged); {way_back(path)}")
    return ckpt


def where_else(path):
    """The advice for a missing checkpoint: the newest earlier run's, kept aside by a new run, or how to get one."""
    earlier = rundir.earlier_runs(os.path.dirname(path) or ".")
    if not earlier:
        return "train one first, or point out_dir at the folder holding ckpt.pt"
    older = f" (older ones: {', '.join(earlier[1:])})" if len(earlier) > 1 else ""
    return (f"an earlier run's checkpoint is kept in {earlier[0]}{older}: use --out_dir={earlier[0]}, or move "
            f"its files back")


def checksum_failure(path):
    """What is damaged, or None: reading every zip entry back checks its CRC-32 (a file not a zip: torch.load's)."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, KeyError, UnicodeError) as e:
        return f"its zip structure is damaged ({e})"
    return f"entry {bad} fails its CRC-32 checksum" if bad else None


def way_back(path):
    """The advice for a corrupted checkpoint: the newest intact copy kept beside it (keep_checkpoints)."""
    folder = os.path.dirname(path) or "."
    copies = [os.path.join(folder, f) for f in os.listdir(folder)
              if re.fullmatch(r"ckpt-\d+\.pt|ckpt-tok\d+-val.*\.pt", f)]
    for kept in sorted(copies, key=os.path.getmtime, reverse=True):
        if not os.path.samefile(kept, path) and not checksum_failure(kept):
            return f"go back to the newest intact copy kept beside it: cp {kept} {path}"
    return ("no intact copy is kept beside it (keep_checkpoints=N keeps the last N as ckpt-<iter>.pt): "
            "restore it from a backup, or train again")


def clean_state_dict(state_dict):
    """Strip wrapper prefixes, and the causal-mask buffers that older nanoGPT versions saved."""
    out = {}
    for k, v in state_dict.items():
        while k.startswith(_WRAPPER_PREFIXES):
            k = k.split(".", 1)[1]
        if k.endswith(".attn.bias") and v.dim() == 4:  # nanoGPT's non-flash mask buffer, not a weight
            continue
        out[k] = v
    return out


# --- models from checkpoints

def model_from_checkpoint(ckpt, path="checkpoint"):
    """Build the GPT a checkpoint describes and load its weights; a mismatch is a clear error."""
    try:
        config = GPTConfig(**ckpt["model_args"])
    except TypeError as e:
        raise UserError(f"{path}: model_args do not describe a GPT ({e})")
    check_fits(config, ckpt["model"], path)
    return load_weights(GPT(config), ckpt["model"], path)


class _NoDraw(torch.overrides.TorchFunctionMode):
    """Modules built with their weights' random init skipped: on the meta device it would only cost time (its
    meta kernels import torch._dynamo: a second and more)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("normal_", "uniform_"):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def check_fits(config, state_dict, path):
    """Refuse model_args that do not fit the weights before a model of their size is allocated (a damaged
    n_embd could ask for tens of GB): shapes compared on the meta device. Missing names are load_weights'."""
    with torch.device("meta"), _NoDraw():
        mine = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in clean_state_dict(state_dict).items() if hasattr(v, "shape")}
    differ = [k for k in mine if k in theirs and mine[k] != theirs[k]]
    if differ or not set(mine) & set(theirs):
        where = (", ".join(f"{k} {list(theirs[k])} (model_args: {list(mine[k])})" for k in differ[:3]) if differ
                 else "no weight of the model is among them")
        raise UserError(f"{path}: its weights do not fit the model its model_args describe: {where}; the "
                        f"checkpoint is damaged or was edited")


def load_weights(model, state_dict, path):
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        first = str(e).replace("\n", " ").replace("\t", "")
        raise UserError(f"{path}: weights do not match the model its config describes: {first[:300]}")
    return model


def load_model(init_from, out_dir):
    """The model to sample or evaluate, and its dataset's metadata (None: GPT-2 BPE), from
    init_from='resume' (out_dir/ckpt.pt), a GPT-2 name, or a transformers folder (its tokenizer.json's)."""
    if init_from != "resume":
        meta = folder_meta(init_from)  # known (or refused) before the weights load
        if init_from.startswith("gpt2") or os.path.isdir(init_from):
            return GPT.from_pretrained(init_from), meta
        raise UserError(f"unknown init_from '{init_from}': use resume, gpt2, gpt2-medium, gpt2-large, "
                        f"gpt2-xl or a folder written by transformers' save_pretrained")
    path, newer = os.path.join(out_dir, "ckpt.pt"), newer_sharded(out_dir)
    if newer:  # ckpt.pt would be an older state of the run, or missing
        raise UserError(f"{newer} (a sharded fsdp checkpoint) is newer than {'' if os.path.exists(path) else 'any '}"
                        f"{path}: make a ckpt.pt of it with `python convert_checkpoint.py --out_dir={out_dir}`")
    ckpt = load_checkpoint(path)
    return model_from_checkpoint(ckpt, path), checkpoint_meta(ckpt, path)


def checkpoint_meta(ckpt, path):
    """A checkpoint's dataset metadata (None: GPT-2 BPE): its own, else (nanoGPT's) data/<its dataset>/'s. A
    smaller vocabulary than GPT-2's without one is refused: GPT-2's BPE would decode its ids as other text."""
    meta, dataset = ckpt.get("dataset_meta"), (ckpt.get("config") or {}).get("dataset")
    if meta is None and dataset:
        meta = read_meta(dataset_dir(dataset))
    vocab = ckpt["model_args"].get("vocab_size", GPT2_VOCAB)
    if meta is None and vocab < GPT2_VOCAB:
        where = (f"and {os.path.join(dataset_dir(dataset), 'meta.pkl')} (or meta.json) is missing: run data/"
                 f"{dataset}/prepare.py, or copy that dataset's meta file there" if dataset else "nor names its "
                 "dataset: set config['dataset'] in it to the data/ folder holding its meta.pkl or meta.json")
        raise UserError(f"{path}: a model of {vocab} tokens (not GPT-2's {GPT2_VOCAB}) whose vocabulary the "
                        f"checkpoint does not hold, {where}")
    return meta


# the types of the entries the code reads from a checkpoint (absent: None); nanoGPT's best_val_loss is a tensor
ENTRIES = {"model": dict, "model_args": dict, "config": dict, "plan": dict, "dataset_meta": dict, "iter_num": int,
           "tokens": int, "skipped_steps": int, "log_position": int, "best_val_loss": (float, int, torch.Tensor),
           "elapsed": (float, int), "initial_val_loss": (float, int), "wandb_run_id": str}


def check_entries(ckpt, path):
    """One line naming file and entry for an entry (ENTRIES), a weight or a model_args field of another type
    than its writer saves: later it would be a ValueError deep in the run, or a count silently wrong."""
    for key, kinds in ENTRIES.items():
        value = ckpt.get(key)
        tensor_ok = not isinstance(value, torch.Tensor) or (value.numel() == 1 and value.is_floating_point())
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) or not tensor_ok
                                  or kinds is int and value < 0):
            want = "int of 0 or more" if kinds is int else "number" if isinstance(kinds, tuple) else kinds.__name__
            raise UserError(f"{path}: its entry {key!r} is {type(value).__name__} {value!r:.40}, not a {want}: the "
                            f"checkpoint is damaged or was edited")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in ckpt["model"].items()):
        raise UserError(f"{path}: its entry 'model' holds more than named tensors: the checkpoint is damaged")
    for key, value in ckpt["model_args"].items():
        want = getattr(GPTConfig.__dataclass_fields__.get(key), "type", None)
        if want in (int, float, bool, str) and value is not None and type(value) is not want \
                and not (want is float and type(value) is int):
            raise UserError(f"{path}: model_args[{key!r}] is {type(value).__name__} {value!r:.40}, not a "
                            f"{want.__name__}: the checkpoint is damaged or was edited")


# --- resuming

def load_for_resume(out_dir, parallelism):
    """The newest of out_dir's checkpoints, with 'path' and, if sharded, 'sharded' (its folder: restore loads its
    weights once the model is sharded). fsdp reads either kind, ddp only ckpt.pt."""
    path, newer = os.path.join(out_dir, 'ckpt.pt'), newer_sharded(out_dir)
    if newer and parallelism != 'fsdp':
        raise UserError(f"{out_dir}'s newest checkpoint is the sharded (fsdp) {newer}: resume with --parallelism=fsdp, "
                        f"or make a ckpt.pt of it with `python convert_checkpoint.py --out_dir={out_dir}`")
    older = sharded.sharded_checkpoint(out_dir) if not newer and parallelism == 'fsdp' else None
    if older and os.path.exists(path):
        print(f"note: resuming from {path}, newer than the sharded {older}")
    ckpt = sharded.load_train_state(newer) if newer else load_checkpoint(path)
    return {**ckpt, 'path': newer or path, 'sharded': newer}


def restore(ckpt, model, optimizer, scaler, train_loader, log, rank, world_size):
    """Put the run's state where its checkpoint (load_for_resume's; None: a new run) left it; returns its counters."""
    state = dict(iter_num=0, best_val_loss=1e9, elapsed=0.0, skipped_steps=0, wandb_run_id=None)
    if ckpt is None:
        return state
    state.update({k: ckpt[k] for k in state if ckpt.get(k) is not None})
    state['best_val_loss'] = float(state['best_val_loss'])  # nanoGPT saves a tensor
    if ckpt['sharded']:
        sharded.load_sharded(ckpt['sharded'], model, optimizer)
    elif isinstance(model, torch.nn.Module) and any(hasattr(p, 'full_tensor') for p in model.parameters()):  # FSDP2's
        print("note: fsdp resumes from a ckpt.pt with its weights; the optimizer state starts afresh")
    elif 'optimizer' in ckpt:
        try:
            load_state(optimizer, ckpt['optimizer'])  # the moments; the hyperparameters stay this run's
        except ValueError as e:  # e.g. a Muon run's state resumed with AdamW, or the other way round
            raise UserError(f"{ckpt['path']}: its optimizer state does not fit this run's optimizer ({e}): resume "
                            f"with the optimizer it was trained with (--optimizer)")
    else:
        print(f"note: {ckpt['path']} holds weights without optimizer state (a converted or exported checkpoint): "
              f"the optimizer's moments start afresh, as when fine-tuning")
    if 'scaler' in ckpt:
        scaler.load_state_dict(ckpt['scaler'])
    if 'train_loader' in ckpt:
        train_loader.load_state_dict(ckpt['train_loader'])
    log.resume_at(ckpt.get('log_position', log.position()))
    rng = ckpt.get('rng')  # one per rank: dropout continues where the saved run left off
    if rng is not None and len(rng) != world_size:
        print(f"note: the checkpoint comes from {len(rng)} processes, this run has {world_size}: "
              f"random streams (dropout) start afresh")
    elif rng is not None:
        set_rng_state(rng[rank])
    return state
