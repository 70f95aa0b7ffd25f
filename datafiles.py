"""
The on-disk dataset format, shared by the prepare scripts (which write it) and the loader (which reads it):

    data/<dataset>/train.bin, val.bin   raw token ids, nanoGPT layout (uint16 unless meta says otherwise)
    data/<dataset>/meta.json            {"tokenizer": "gpt2" | "char", "vocab_size": int, "dtype": "uint16",
                                         "itos": [...] for "char": the character of each id}

nanoGPT's meta.pkl is still read, but only through an unpickler that accepts plain data and nothing that
could run code.
"""
import io
import json
import os
import pickle

import numpy as np

from atomic import atomic_write
from errors import UserError

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def dtype_for_vocab(vocab_size):
    return "uint16" if vocab_size <= 2**16 else "uint32"


def write_tokens(path, ids, dtype="uint16"):
    """Write token ids to a .bin file atomically, after checking every id fits the storage dtype."""
    ids = np.asarray(ids)
    limit = np.iinfo(DTYPES[dtype]).max
    if ids.size and (ids.min() < 0 or ids.max() > limit):
        raise ValueError(f"token id {ids.max()} does not fit {dtype} (max {limit})")
    with atomic_write(path) as f:
        f.write(ids.astype(DTYPES[dtype]).tobytes())


def write_meta(data_dir, meta):
    with atomic_write(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)


class _PlainDataUnpickler(pickle.Unpickler):
    # dicts, lists, strs and ints need no class lookups; anything that asks for one is refused
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain data is allowed")


def read_meta(data_dir):
    """The dataset's metadata as a dict, or None when it has none (then it is GPT-2 BPE, as in nanoGPT)."""
    path = os.path.join(data_dir, "meta.json")
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path} is not valid JSON ({e}); re-run the dataset's prepare.py")
    elif os.path.exists(os.path.join(data_dir, "meta.pkl")):
        path = os.path.join(data_dir, "meta.pkl")
        try:
            with open(path, "rb") as f:
                meta = _PlainDataUnpickler(io.BytesIO(f.read())).load()
        except Exception as e:
            raise UserError(f"{path} could not be read as plain data ({e}); re-run the dataset's prepare.py")
        if isinstance(meta, dict) and "itos" in meta:  # nanoGPT char meta: itos is {id: char}
            meta = {"tokenizer": "char", "vocab_size": meta["vocab_size"],
                    "itos": [meta["itos"][i] for i in range(meta["vocab_size"])]}
    else:
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int):
        raise UserError(f"{path} has no integer vocab_size; re-run the dataset's prepare.py")
    meta.setdefault("tokenizer", "char" if "itos" in meta else "gpt2")
    meta.setdefault("dtype", "uint16")
    if meta["dtype"] not in DTYPES:
        raise UserError(f"{path}: unknown dtype {meta['dtype']!r} (expected one of {sorted(DTYPES)})")
    return meta


def open_tokens(path, dtype="uint16"):
    """A read-only memmap over a .bin file, after checking it is a whole number of tokens and not empty."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    size = os.path.getsize(path)
    if size == 0:
        raise UserError(f"{path} is empty; re-run the dataset's prepare.py")
    if size % itemsize:
        raise UserError(f"{path} is {size} bytes, not a whole number of {dtype} tokens "
                        f"(truncated or not a {dtype} token file); re-run the dataset's prepare.py")
    return np.memmap(path, dtype=DTYPES[dtype], mode="r")
