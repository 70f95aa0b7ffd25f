"""Sharded checkpoints (parallelism=fsdp) through torch.distributed.checkpoint (DCP): every rank writes its part into
out_dir/ckpt_dcp/, rank 0 also the training state (train_state.pt, written last); convert_sharded makes one ckpt.pt of
it. torch.distributed.checkpoint is imported inside the functions that use it: importing it takes seconds."""
import os
import pickle
import shutil
import tempfile

import torch
import torch.distributed as dist

from gpt import checkpoint  # the module, not its names: it imports this one while it loads
from gpt.checkpoint import rundir
from gpt.runtime.errors import UserError

DCP_DIR = "ckpt_dcp"
TRAIN_STATE = "train_state.pt"
FIX = "copy the whole folder again (.metadata and every __*.distcp file), or use an earlier checkpoint"
# everything a DCP .metadata pickle names (besides torch's dtypes), listed from real saves: the rest could run code
METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
                                              "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # looks a layout up by its name
    "torch": {"Size"}, "pathlib": {"PosixPath", "PurePosixPath"}, "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "bytearray", "complex", "slice"},
}


class Refused(pickle.UnpicklingError):
    pass


class MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name in METADATA_GLOBALS.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise Refused(f"{module}.{name}")


def read_metadata(path):
    """The sharded checkpoint's DCP metadata, read with only METADATA_GLOBALS allowed. DCP's own reader unpickles
    it unrestricted, so this comes before every DCP call that opens the folder (docs/checkpoints.md)."""
    from torch.distributed.checkpoint.metadata import Metadata  # slow to import (the module docstring)
    file = os.path.join(path, ".metadata")
    try:
        with open(file, "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except Refused as e:
        raise UserError(f"{file} is unsafe, not loaded: it names {e}, which no sharded checkpoint holds, and "
                        f"loading it could run code; use a checkpoint from a source you trust") from None
    except Exception as e:  # noqa: BLE001 - missing, unreadable or not DCP's: the folder's fault either way
        raise UserError(f"{path} is not a whole sharded checkpoint: its .metadata cannot be read "
                        f"({type(e).__name__}: {str(e)[:100]}); {FIX}") from None
    if not isinstance(metadata, Metadata):
        raise UserError(f"{path} is not a whole sharded checkpoint: its .metadata cannot be read (it holds a "
                        f"{type(metadata).__name__}); {FIX}")
    return metadata


def save_sharded(out_dir, model, optimizer, train_state, before_replace=None):
    """Every rank writes its shards, rank 0 also the training state, into a temporary folder renamed into place:
    a crash mid-save leaves the previous checkpoint whole. before_replace: rank 0's last check before that."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    final = os.path.join(out_dir, DCP_DIR)
    tmp, old = final + ".tmp", final + ".old"
    if dist.get_rank() == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)  # what a killed save left
    dist.barrier()
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


def load_sharded(path, model, optimizer):
    """Fill the (already sharded) model and optimizer from a sharded checkpoint, each rank its own part."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    read_metadata(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def sharded_checkpoint(out_dir, required=False):
    """The sharded checkpoint's folder, or None (required: one line saying what is there instead). A crash between
    save_sharded's two renames leaves only the .old folder, then the latest whole checkpoint."""
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


def newer_sharded(out_dir):
    """The sharded checkpoint's folder where it is out_dir's newest checkpoint (ckpt.pt missing or older)."""
    sharded, single = sharded_checkpoint(out_dir), os.path.join(out_dir, 'ckpt.pt')
    if sharded is None or (os.path.exists(single) and
                           os.path.getmtime(single) >= os.path.getmtime(os.path.join(sharded, TRAIN_STATE))):
        return None
    return sharded


def load_train_state(path):
    """A sharded checkpoint's training state, once the folder is checked whole: .metadata, model weights in it,
    and every shard file it names, as long as it says (a partial copy would fail deep in DCP's reader)."""
    metadata = read_metadata(path)
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
            raise UserError(f"{path} is not a whole sharded checkpoint: its shard file {name} {problem}; {FIX}")
    state = checkpoint.safe_load(os.path.join(path, TRAIN_STATE))
    if not isinstance(state, dict) or "model_args" not in state:
        raise UserError(f"{os.path.join(path, TRAIN_STATE)} holds no training state (no model_args); {FIX}")
    return state


def convert_sharded(out_dir):
    """out_dir's sharded checkpoint as one ckpt.pt beside it, made in one process after every check: weights and
    training state (the optimizer state, keyed by parameter name in DCP, stays behind). Returns the path, or None."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    path, target = sharded_checkpoint(out_dir, required=True), os.path.join(out_dir, 'ckpt.pt')
    if os.path.isdir(target):
        raise UserError(f"{target} is a folder: move it aside, the conversion writes the checkpoint there")
    rundir.check_writable(out_dir)
    state = load_train_state(path)  # read_metadata first
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
    checkpoint.model_from_checkpoint(ckpt, path)  # the weights make the model its model_args describe
    if checkpoint.write_checkpoint(ckpt, target):
        return None
    print(f"wrote {target} (step {state.get('iter_num')}; weights only, without the optimizer state)")
    return target
