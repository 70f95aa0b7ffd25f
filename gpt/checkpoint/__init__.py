"""
Checkpoint I/O. The file keeps nanoGPT's ckpt.pt layout (model, optimizer, model_args, iter_num,
best_val_loss, config, plus our additions), holds only tensors and plain types, is written atomically
and is read with torch.load(weights_only=True), so a checkpoint can never run code.
"""
import math
import os
import pickle
import random
import re
import shutil
import tempfile
import zipfile
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from gpt.checkpoint import rundir
from gpt.data import dataset_dir, read_meta
from gpt.optim import load_state
from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write
from model import GPT, GPTConfig

DCP_DIR = "ckpt_dcp"  # a sharded checkpoint (parallelism=fsdp): every rank writes its part
TRAIN_STATE = "train_state.pt"  # the non-tensor part of a sharded checkpoint, written by rank 0
# how far above the best val loss so far (in nats) a loss that is also above the untrained model's counts as
# divergence: docs/checkpoints.md#numerical-faults says why 1 nat
DIVERGENCE_MARGIN = 1.0
# prefixes that torch.compile (_orig_mod.) and DDP (module.) put in front of parameter names
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


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


def save_checkpoint(ckpt, path):
    """Write atomically; on failure (disk full, quota, read-only, I/O error) say so in one line and keep the
    previous file. Returns whether the save succeeded."""
    return write_checkpoint(ckpt, path) is None


def write_checkpoint(ckpt, path, before_replace=None):
    """save_checkpoint's work: returns None when the checkpoint is on disk, else why not (said in one line).
    before_replace: atomic_write's last check before the file takes the place of the old one."""
    # temp files of saves that a crash or kill -9 cut short would otherwise pile up, each a whole checkpoint
    folder, name = os.path.split(os.path.abspath(path))
    for stale in os.listdir(folder):
        if stale.startswith(name + ".") and stale.endswith(".tmp"):
            try:
                os.remove(os.path.join(folder, stale))
            except OSError:
                pass  # a read-only folder: the save below says so
    try:
        with atomic_write(path, before_replace=before_replace) as f:
            torch.save(ckpt, f)
        return None
    except (OSError, RuntimeError) as e:
        reason = write_failure(e)
        if reason is None:
            raise  # not a failure to write: a bug, with its traceback
        print(f"error: could not save checkpoint to {path} ({reason}); the previous checkpoint is kept")
        return f"{path}: {reason}"


def write_failure(e):
    """What went wrong when a write failed (disk full, quota, read-only, I/O error), or None when `e` is not a
    failure to write. torch.save reports these as a RuntimeError from its zip writer (inline_container.cc)
    that chains the OSError, or names nothing when it found out by itself (a short write: "unexpected pos")."""
    for err in (e, e.__cause__, e.__context__):
        if isinstance(err, OSError):
            return err.strerror or str(err)
    if isinstance(e, RuntimeError) and ("inline_container" in str(e) or "PytorchStreamWriter" in str(e)):
        return "the file could not be written whole: " + str(e).strip().splitlines()[0][:120]
    return None


def gather_rng_states():
    """Every rank's random state, in rank order (every rank must call this)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [rng_state()]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


class Saver:
    """What a run knows of its own checkpoints, held by train.py (one per process): the last good checkpoint,
    whether the weights are judged broken since the last evaluation, why the last save failed, and whose
    out_dir it is (claim: gpt/checkpoint/rundir.py's Claim on rank 0, checked before every save; None elsewhere).
    Commands change it: record_eval, save. Queries do not: to_save, last_good, check_end.
    resumed: the checkpoint the run resumes from (load_for_resume's), or None."""

    def __init__(self, out_dir, claim=None, resumed=None):
        self.out_dir, self.claim = out_dir, claim
        self.good = None  # (path, iter_num) of the last checkpoint this run wrote or resumed from
        self.initial_val_loss = None  # the untrained model's val loss: a healthy run never goes above it
        self.diverged = None  # why the last evaluation says the weights are broken, or None
        self.save_failed = None  # why the last save failed, or None
        if resumed is not None:
            self.good = (resumed['path'], resumed.get('iter_num', 0))
            # a checkpoint that does not record it (nanoGPT's): an untrained model's loss is ln(vocab_size)
            self.initial_val_loss = resumed.get('initial_val_loss') or math.log(resumed['model_args']['vocab_size'])

    def record_eval(self, iter_num, val_loss, best_val_loss):
        """A val loss was evaluated at iter_num (best_val_loss: the best before it): judge the weights by it,
        saying so when they are broken. The first evaluation of a new run is the untrained model's."""
        if self.initial_val_loss is None and math.isfinite(val_loss):
            self.initial_val_loss = val_loss
        self.diverged = divergence(iter_num, val_loss, best_val_loss, self.initial_val_loss)
        if self.diverged and is_master():
            print(f"step {iter_num}: not saving a checkpoint: {self.diverged}")

    def to_save(self, iter_num, due_now, val_loss, best_val_loss, eval_only, always_save_checkpoint,
                checkpoint_interval):
        """The checkpoints to write at this step (due's answer), none while the weights are judged broken."""
        if self.diverged:
            return []
        return due(iter_num, due_now, val_loss, best_val_loss, eval_only, always_save_checkpoint, checkpoint_interval)

    def save(self, model, optimizer, sharded=False, name=None, keep=0, **state):
        """A training checkpoint: the model and optimizer, plus `state` (iter_num, config, ...), every rank's
        random state and the untrained model's val loss. Every rank calls this, and nobody moves on, or
        exits, before it is on disk. Nothing is written while the weights are judged broken, or when they
        hold a NaN or inf; a run whose out_dir another run has claimed stops here (UserError).
        sharded (parallelism=fsdp under torchrun): every rank writes its part into out_dir/ckpt_dcp/. Otherwise
        rank 0 writes out_dir/ckpt.pt and keeps the last `keep` of them as numbered copies (0: none); with a
        name, out_dir/<name> instead, a checkpoint kept beside ckpt.pt (e.g. ckpt-tok<tokens>-val<loss>.pt),
        and only the last `keep` of its kind (0: all). Returns whether it was written (False on ranks > 0
        of an unsharded save, which write nothing)."""
        self.check_owner()
        if self.diverged:
            if is_master():
                print(f"not saving a checkpoint: {self.diverged} ({self.last_good()})")
            return False
        state = {**state, "initial_val_loss": self.initial_val_loss}
        if sharded:
            save_sharded(self.out_dir, model, optimizer, {**state, 'rng': gather_rng_states()},
                         before_replace=partial(self.check_owner, broadcast=False))
            self.good = (os.path.join(self.out_dir, DCP_DIR), state["iter_num"])
            return True
        rng = gather_rng_states()
        saved = is_master() and self.write(model, optimizer, name, keep, {**state, "rng": rng})
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return saved

    def check_owner(self, broadcast=True):
        """Stop the run (UserError) if out_dir is no longer its own. Asked by every rank before a save, and by
        rank 0 alone again just before its file replaces the old one: writing a checkpoint takes seconds,
        and another run may claim the folder meanwhile."""
        problem = self.owner_problem() if broadcast else self.claim and self.claim.owner_problem()
        if problem:
            raise UserError(f"not saving to {self.out_dir}: {problem}; this run stops so as not to write over "
                            f"that run's files ({self.last_good()})")

    def owner_problem(self):
        """Why out_dir is no longer this run's (rank 0's claim says; every rank gets its answer), or None."""
        problem = self.claim.owner_problem() if self.claim is not None else None
        if dist.is_available() and dist.is_initialized():
            box = [problem]
            dist.broadcast_object_list(box, src=0)
            problem = box[0]
        return problem

    def write(self, model, optimizer, name, keep, state):
        """Rank 0's part of an unsharded save; returns whether it was written."""
        path = os.path.join(self.out_dir, name or "ckpt.pt")
        model_sd = model.state_dict()
        bad = next((k for k, v in model_sd.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
        if bad is not None:
            print(f"error: not saving checkpoint {path}: weight {bad} holds NaN or inf ({self.last_good()})")
            return False
        print(f"saving checkpoint to {path}")
        ckpt = {"model": model_sd, "optimizer": portable(optimizer.state_dict()), **state}
        self.save_failed = write_checkpoint(ckpt, path, before_replace=partial(self.check_owner, broadcast=False))
        if self.save_failed:
            return False
        if name is None:
            self.good = (path, state["iter_num"])
        if keep > 0 and name is None:
            keep_numbered_copy(path, state["iter_num"], keep)
        elif keep > 0:
            prune_checkpoints(self.out_dir, name, keep)
        return True

    def last_good(self):
        """Which checkpoint is the good one to go back to, in words: the last this run wrote or resumed from."""
        if self.good is not None:
            return f"the last good checkpoint is {self.good[0]}, from step {self.good[1]}"
        path = os.path.join(self.out_dir, "ckpt.pt")
        if os.path.exists(path):
            return f"{path} was not written by this run"
        earlier = rundir.earlier_runs(self.out_dir)
        return f"there is no good checkpoint: this run wrote none to {self.out_dir}" + (
            f" (an earlier run's is kept in {earlier[0]})" if earlier else "")

    def check_end(self):
        """At the end of a run: one error line (status 2) when its last save failed or its weights ended
        broken, so that no script takes the run for complete."""
        if self.save_failed:
            raise UserError(f"the run's last checkpoint could not be saved ({self.save_failed}); {self.last_good()}")
        if self.diverged:
            raise UserError(f"the run ended with broken weights, not saved ({self.diverged}); {self.last_good()}. "
                            f"Try a lower learning_rate, or check the data")


def is_master():
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def divergence(iter_num, val_loss, best_val_loss, initial_val_loss):
    """Why a val loss says the weights are broken, in words, or None: it is NaN or inf, or above both the
    untrained model's loss (initial_val_loss) and the best so far plus DIVERGENCE_MARGIN
    (docs/checkpoints.md#numerical-faults says why)."""
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
    """The checkpoints the schedule asks for at this step, after its evaluations (`due`: schedule.due's answer,
    val_loss the loss just evaluated or None): None stands for ckpt.pt, a file name for a checkpoint kept
    beside it. checkpoint_interval 0 saves ckpt.pt at evaluations, when the val loss improved or
    always_save_checkpoint; N > 0 every N steps and at the end; -1 never. ckpt_every_tokens's checkpoints are
    named with the tokens seen and the val loss. Nothing at step 0 (nothing trained yet) or with eval_only.
    (Saver.to_save asks this, and answers nothing while a diverged run's weights are broken.)"""
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


def portable(optimizer_state):
    """An optimizer state_dict as an eager run keeps it (a float learning rate, capturable off: what
    stepgraph.py's CUDA graph changes), so that any checkpoint resumes anywhere, on a CPU too."""
    for group in optimizer_state["param_groups"]:
        group["lr"], group["capturable"] = float(group["lr"]), False
    return optimizer_state


def load_checkpoint(path):
    """Read a checkpoint onto the CPU (no GPU memory spike), refusing anything that is not plain data."""
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}: {where_else(path)}")
    damage = checksum_failure(path)
    if damage:
        raise UserError(f"{path} is corrupted: {damage}, so its contents are not what was saved (a disk, "
                        f"memory or copy error); {way_back(path)}")
    ckpt = safe_load(path)
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UserError(f"{path} is not a GPT checkpoint (no 'model' and 'model_args' entries)")
    ckpt["model"] = clean_state_dict(ckpt["model"])
    return ckpt


def where_else(path):
    """The advice for a missing checkpoint: the newest earlier run's, kept aside by a new run into its folder
    (gpt/checkpoint/rundir.py), or how to get one."""
    folder = os.path.dirname(path) or "."
    earlier = rundir.earlier_runs(folder)
    if not earlier:
        return "train one first, or point out_dir at the folder holding ckpt.pt"
    older = f" (older ones: {', '.join(earlier[1:])})" if len(earlier) > 1 else ""
    return (f"an earlier run's checkpoint is kept in {earlier[0]}{older}: use --out_dir={earlier[0]}, or move "
            f"its files back")


# how torch.save's legacy (pre-zip) files begin: pickle protocol 2, then torch's magic number as a long
LEGACY_START = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def safe_load(path):
    """torch.load(weights_only=True) onto the CPU, its failures one line each. torch's own message for a
    refused pickle advises loading with weights_only=False, which would run whatever code the file holds:
    that advice is never passed on, only what was refused."""
    try:
        with open(path, "rb") as f:
            start = f.read(len(LEGACY_START))
    except OSError as e:
        raise UserError(f"{path} could not be read ({e.strerror or e})")
    if not zipfile.is_zipfile(path) and start != LEGACY_START and start:
        # torch.load would read any other file as a legacy pickle and fail with whatever that decoding hit
        raise UserError(f"{path} is not a PyTorch checkpoint (neither torch.save's zip format nor its legacy "
                        f"one): point out_dir or the path at the ckpt.pt a run wrote")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever a damaged file makes the unpickler raise is the file's fault
        text = str(e)
        refused = re.search(r"GLOBAL ([\w.]+)", text) if isinstance(e, pickle.UnpicklingError) else None
        if refused:
            raise UserError(f"{path} is unsafe, not loaded: it holds an object of class {refused.group(1)}, and "
                            f"loading that could run code (checkpoints may hold only tensors and plain data); "
                            f"if you trust the file, re-save it without that entry")
        if "weights_only" in text or "WeightsUnpickler" in text:  # refused for another reason than a class
            detail = re.search(r"WeightsUnpickler error:\s*([^.\n]+)", text)  # e.g. Unsupported operand 105
            raise UserError(f"{path} is unsafe, not loaded: it holds more than tensors and plain data"
                            + (f" ({detail.group(1).strip()[:200]})" if detail else "")
                            + ", and loading that could run code; if you trust the file, re-save it with only "
                              "tensors and plain data")
        reason = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupted): {reason[:200]}")


def checksum_failure(path):
    """What is damaged in a checkpoint, or None. torch.save writes a zip file whose every entry (each tensor's
    bytes, the pickle) carries a CRC-32 of its contents, which torch.load never checks: reading every entry
    back checks them all (0.7-0.9 s for GPT-2 124M with its optimizer state, 1.4 GiB: docs/checkpoints.md).
    Files that are not zip files (truncated ones, nanoGPT's legacy format) are left to torch.load."""
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
    copies = [f for f in os.listdir(folder) if re.fullmatch(r"ckpt-\d+\.pt|ckpt-tok\d+-val.*\.pt", f)]
    copies.sort(key=lambda f: os.path.getmtime(os.path.join(folder, f)), reverse=True)
    for copy in copies:
        full = os.path.join(folder, copy)
        if os.path.realpath(full) != os.path.realpath(path) and not os.path.samefile(full, path) \
                and not checksum_failure(full):
            return f"go back to the newest intact copy kept beside it: cp {full} {path}"
    return ("no intact copy is kept beside it (keep_checkpoints=N keeps the last N as ckpt-<iter>.pt): "
            "restore it from a backup, or train again")


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
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("normal_", "uniform_"):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def check_fits(config, state_dict, path):
    """The weights' shapes against those of the model `config` describes, built on the meta device (no memory,
    no time): model_args that do not fit the weights are refused before a model of their size is allocated
    (a damaged n_embd could ask for tens of GB). Names only one side has are load_weights' to report."""
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
    """Load a state dict into a model built from its config; a mismatch is a clear error."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        first = str(e).replace("\n", " ").replace("\t", "")
        raise UserError(f"{path}: weights do not match the model its config describes: {first[:300]}")
    return model


def load_model(init_from, out_dir):
    """The model to sample or evaluate, and its dataset's metadata (None: GPT-2 BPE), from
    init_from='resume' (out_dir/ckpt.pt), a GPT-2 name, or a transformers folder."""
    if init_from == "resume":
        path = os.path.join(out_dir, "ckpt.pt")
        sharded = newer_sharded(out_dir)
        if sharded:  # ckpt.pt would be an older state of the run, or missing
            raise UserError(f"{sharded} (a sharded fsdp checkpoint) is newer than "
                            + (f"{path}" if os.path.exists(path) else f"any {path}")
                            + f": make a ckpt.pt of it with `python convert_checkpoint.py --out_dir={out_dir}`")
        ckpt = load_checkpoint(path)
        model = model_from_checkpoint(ckpt, path)
        meta = ckpt.get("dataset_meta")
        if meta is None and "dataset" in ckpt.get("config", {}):
            # a nanoGPT checkpoint: the dataset's metadata is where nanoGPT keeps it
            meta = read_meta(dataset_dir(ckpt["config"]["dataset"]))
        return model, meta
    if init_from.startswith("gpt2") or os.path.isdir(init_from):
        return pretrained_gpt2(init_from), None
    raise UserError(f"unknown init_from '{init_from}': use resume, gpt2, gpt2-medium, gpt2-large, "
                    f"gpt2-xl or a folder written by transformers' save_pretrained")


def pretrained_gpt2(name, dropout=0.0):
    """OpenAI's GPT-2 weights through transformers, with a clear error when they cannot be had."""
    args, state_dict = pretrained_weights(name)
    return load_weights(GPT(GPTConfig(**{**args, "dropout": dropout})), state_dict, name)


def pretrained_weights(name):
    """(model_args, state dict) of a GPT-2 name (downloaded by transformers) or a transformers folder."""
    from gpt import hf  # imported here: transformers is slow to import, and only this needs it
    try:
        return hf.load_pretrained(name)
    except OSError as e:
        raise UserError(f"could not load GPT-2 weights '{name}' (no network, or not a model name or "
                        f"folder?): {str(e).splitlines()[0]}")


def rng_state():
    """This process's random generators (python, numpy, torch CPU and CUDA) as tensors and plain types,
    so the checkpoint stays loadable with weights_only=True."""
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


def keep_numbered_copy(path, iter_num, keep):
    """Besides ckpt.pt, keep the last `keep` checkpoints as ckpt-<iter>.pt (hard links: no extra disk)."""
    folder = os.path.dirname(path)
    copy = os.path.join(folder, f"ckpt-{iter_num:07d}.pt")
    try:
        if os.path.exists(copy):
            os.remove(copy)
        try:
            os.link(path, copy)
        except OSError:  # file systems without hard links
            shutil.copyfile(path, copy)
        # by step, not by name: past 9,999,999 steps the names grow a digit (not ckpt-tok...: only digits)
        copies = sorted((int(m.group(1)), f) for f in os.listdir(folder) if (m := re.fullmatch(r"ckpt-(\d+)\.pt", f)))
        for _, old in copies[:-keep]:
            os.remove(os.path.join(folder, old))
    except OSError as e:
        print(f"error: could not keep a numbered copy of {path} ({e.strerror or e})")


def prune_checkpoints(folder, name, keep):
    """Remove all but the last `keep` .pt files of name's kind: named like it up to its first digit, then a
    number (ckpt-tok<N>...), ordered by that number (not by name: tok900 comes before tok1000)."""
    prefix = re.match(r"\D*", name).group()
    kind = re.compile(re.escape(prefix) + r"(\d+).*\.pt")
    copies = sorted((int(m.group(1)), f) for f in os.listdir(folder) if (m := kind.fullmatch(f)))
    for _, old in copies[:-keep]:
        try:
            os.remove(os.path.join(folder, old))
        except OSError as e:
            print(f"error: could not remove the old checkpoint {old} ({e.strerror or e})")


def newer_sharded(out_dir):
    """The sharded checkpoint's folder where it is the newest checkpoint of out_dir (ckpt.pt missing or older),
    else None: where both exist, the newer one is the run's state and the other an older one."""
    sharded = sharded_checkpoint(out_dir)
    single = os.path.join(out_dir, 'ckpt.pt')
    if sharded is None:
        return None
    if os.path.exists(single) and os.path.getmtime(single) >= os.path.getmtime(os.path.join(sharded, TRAIN_STATE)):
        return None
    return sharded


def load_for_resume(out_dir, parallelism):
    """The checkpoint a resumed run starts from: the newest of out_dir's. fsdp runs save sharded checkpoints,
    every rank its part (their weights are loaded once the model is sharded too: see restore); the rest a
    single ckpt.pt; fsdp resumes from a ckpt.pt newer than its sharded one, ddp cannot read a sharded one.
    The returned dict says where it came from under 'path' and, if sharded, 'sharded'."""
    path = os.path.join(out_dir, 'ckpt.pt')
    sharded = newer_sharded(out_dir)
    if sharded and parallelism != 'fsdp':
        raise UserError(f"{out_dir}'s newest checkpoint is the sharded (fsdp) {sharded}: resume with "
                        f"--parallelism=fsdp, or make a ckpt.pt of it with `python convert_checkpoint.py "
                        f"--out_dir={out_dir}`")
    older = sharded_checkpoint(out_dir) if not sharded and parallelism == 'fsdp' else None
    if older and os.path.exists(path):
        print(f"note: resuming from {path}, newer than the sharded {older}")
    ckpt = load_train_state(sharded) if sharded else load_checkpoint(path)
    return {**ckpt, 'path': sharded or path, 'sharded': sharded}


def restore(ckpt, model, optimizer, scaler, train_loader, log, rank, world_size):
    """Put a resumed run's weights (sharded), optimizer, GradScaler, data position, log and random state
    where its checkpoint (from load_for_resume; None for a new run) left them. Returns the run's counters:
    iter_num, best_val_loss, elapsed (training seconds of the earlier launches), skipped_steps and
    wandb_run_id (a resumed run goes on in the same wandb run)."""
    state = dict(iter_num=0, best_val_loss=1e9, elapsed=0.0, skipped_steps=0, wandb_run_id=None)
    if ckpt is None:
        return state
    state.update({k: ckpt[k] for k in state if ckpt.get(k) is not None})
    state['best_val_loss'] = float(state['best_val_loss'])  # nanoGPT saves a tensor
    if ckpt['sharded']:
        load_sharded(ckpt['sharded'], model, optimizer)
    elif isinstance(model, torch.nn.Module) and is_sharded(model):
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


def is_sharded(model):
    """Whether FSDP2 has sharded the model's parameters (they are DTensors then)."""
    return any(hasattr(p, 'full_tensor') for p in model.parameters())


# sharded checkpoints (parallelism=fsdp) go through torch.distributed.checkpoint (DCP): every rank writes
# its own part into out_dir/ckpt_dcp/; convert_checkpoint.py turns one into a single ckpt.pt
def save_sharded(out_dir, model, optimizer, train_state, before_replace=None):
    """Every rank writes its shards of the model and optimizer; rank 0 also the rest of the training state.
    Written to a temporary folder and renamed, so a crash mid-save leaves the previous checkpoint whole.
    before_replace: rank 0's last check before the renames (it may raise to call them off)."""
    final = os.path.join(out_dir, DCP_DIR)
    tmp, old = final + ".tmp", final + ".old"
    if dist.get_rank() == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)  # what a killed save left
    dist.barrier()
    import torch.distributed.checkpoint as dcp  # here, not at the top: importing it takes seconds
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
    if dist.get_rank() == 0:
        torch.save(train_state, os.path.join(tmp, TRAIN_STATE))
        if before_replace is not None:
            before_replace()
        if os.path.exists(final):
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        print(f"saved sharded checkpoint to {final}")
    dist.barrier()


def sharded_checkpoint(out_dir, required=False):
    """The sharded checkpoint's folder, or None (required: one line saying what is there instead). A crash
    between the two renames of save_sharded leaves only the .old folder, then the latest whole checkpoint."""
    for name in (DCP_DIR, DCP_DIR + ".old"):
        path = os.path.join(out_dir, name)
        if os.path.exists(os.path.join(path, TRAIN_STATE)):
            return path
    if not required:
        return None
    folder = os.path.join(out_dir, DCP_DIR)
    if not os.path.isdir(out_dir):
        problem = "is not a folder" if os.path.exists(out_dir) else "does not exist"
        raise UserError(f"out_dir {out_dir} {problem}: point --out_dir at the folder of a parallelism=fsdp run")
    if os.path.isdir(folder):
        raise UserError(f"{folder} is not a whole sharded checkpoint: it has no {TRAIN_STATE}, which a save "
                        f"writes last; copy the whole folder again, or use an earlier checkpoint")
    there = f"{folder} is not a folder" if os.path.exists(folder) else f"it has no {DCP_DIR}/ folder"
    if os.path.isfile(os.path.join(out_dir, "ckpt.pt")):
        there += ", and its ckpt.pt needs no conversion (sample.py reads it as it is)"
    raise UserError(f"no sharded checkpoint in {out_dir}: {there}; parallelism=fsdp runs write one")


def load_train_state(path):
    """A sharded checkpoint's training state, after checking the folder is whole: DCP's .metadata, weights of
    the model in it, and every shard file it names, as long as it says. A folder copied in part or cut short
    would otherwise fail deep in torch.distributed.checkpoint's reader (or only after the conversion's work)."""
    import torch.distributed.checkpoint as dcp
    fix = "copy the whole folder again (.metadata and every __*.distcp file), or use an earlier checkpoint"
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:  # noqa: BLE001 - missing, unreadable or not DCP's: the folder's fault either way
        raise UserError(f"{path} is not a whole sharded checkpoint: its .metadata cannot be read "
                        f"({type(e).__name__}: {str(e)[:100]}); {fix}") from None
    if not any(key.startswith("model.") for key in metadata.state_dict_metadata):
        raise UserError(f"{path} is not a sharded checkpoint of a model: its .metadata lists no model weights")
    needed = {}  # each shard file's least size: the end of the last tensor it holds
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = os.path.join(path, name)
        have = os.path.getsize(file) if os.path.isfile(file) else None
        if have is None or have < size:
            problem = "is missing" if have is None else f"is cut short ({have:,} of {size:,} bytes)"
            raise UserError(f"{path} is not a whole sharded checkpoint: its shard file {name} {problem}; {fix}")
    state = safe_load(os.path.join(path, TRAIN_STATE))
    if not isinstance(state, dict) or "model_args" not in state:
        raise UserError(f"{os.path.join(path, TRAIN_STATE)} holds no training state (no model_args); {fix}")
    return state


def load_sharded(path, model, optimizer):
    """Fill the (already sharded) model and optimizer from a sharded checkpoint, each rank its own part."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def convert_sharded(out_dir):
    """Turn out_dir's sharded checkpoint into one ckpt.pt beside it (weights and training state; the
    optimizer state stays behind: in DCP it is keyed by parameter name, not torch.optim's layout).
    Runs in one process, no GPU needed. Everything is checked before the work: the checkpoint whole, ckpt.pt's
    place writable. Returns the path written, or None when the save failed."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    path, target = sharded_checkpoint(out_dir, required=True), os.path.join(out_dir, 'ckpt.pt')
    if os.path.isdir(target):
        raise UserError(f"{target} is a folder: move it aside, the conversion writes the checkpoint there")
    rundir.check_writable(out_dir)
    state = load_train_state(path)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        try:
            dcp_to_torch_save(path, os.path.join(tmp, 'full.pt'))  # gathers every rank's shards
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - whole in size, yet the bytes do not decode
            cause = next(iter(e.failures.values()))[0] if isinstance(e, CheckpointException) and e.failures else e
            # the cause's name only: torch's text for a refused unpickling advises loading unsafely
            raise UserError(f"{path}: its shards could not be read ({type(cause).__name__}), they are damaged; "
                            f"copy the whole folder again, or use an earlier checkpoint") from None
        full = torch.load(os.path.join(tmp, 'full.pt'), map_location='cpu', weights_only=True)
    ckpt = {**state, 'model': full['model']}
    model_from_checkpoint(ckpt, path)  # check that the weights make the model its model_args describe
    if not save_checkpoint(ckpt, target):
        return None
    print(f"wrote {target} (step {state.get('iter_num')}; weights only, without the optimizer state)")
    return target
