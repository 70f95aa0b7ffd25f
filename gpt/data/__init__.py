"""The on-disk dataset format training reads (sources.py writes it), and finding a dataset's folder (docs/data.md)."""
import glob
import json
import os
import pickle
from pathlib import Path

import numpy as np

from gpt.data.tokenizer import hf_meta
from gpt.runtime.errors import UserError
from gpt.runtime.files import nearest_existing

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder of train.py and data/


class _PlainDataUnpickler(pickle.Unpickler):
    # nanoGPT's meta.pkl holds dicts, lists, strs and ints, which need no class lookups; anything that asks for
    # one (code that could run) is refused
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain data is allowed")


def check_readable(path, what="token file"):
    """One line, not numpy's or open()'s traceback, for a path that is no readable regular file."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not a {what}; re-run the dataset's prepare.py")
    if not os.path.isfile(path):
        raise UserError(f"{path} is not a regular file, so not a {what}; re-run the dataset's prepare.py")
    try:
        open(path, "rb").close()
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror or e}): check its permissions")


def read_meta(data_dir):
    """The dataset's metadata as a dict, or None when it has none (then it is GPT-2 BPE, as in nanoGPT)."""
    path = next((p for p in (os.path.join(data_dir, f) for f in ("meta.json", "meta.pkl")) if os.path.exists(p)), None)
    if path is None:
        return None
    check_readable(path, "metadata file")
    if path.endswith(".json"):
        try:
            meta = json.loads(Path(path).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path} is not valid JSON ({e}); re-run the dataset's prepare.py")
    else:
        try:
            with open(path, "rb") as f:
                meta = _PlainDataUnpickler(f).load()
        except Exception as e:
            raise UserError(f"{path} could not be read as plain data ({e}); re-run the dataset's prepare.py")
        if isinstance(meta, dict) and "itos" in meta:
            meta = nanogpt_char_meta(meta, path)
    if not isinstance(meta, dict):
        raise UserError(f"{path} holds a {type(meta).__name__}, not a dict of metadata; "
                        f"re-run the dataset's prepare.py")
    if type(meta.get("vocab_size")) is not int or meta["vocab_size"] <= 0:
        raise UserError(f"{path} has no positive integer vocab_size; re-run the dataset's prepare.py")
    meta.setdefault("tokenizer", "char" if "itos" in meta else "gpt2")
    meta.setdefault("dtype", "uint16")
    check_meta(meta, path)
    if meta["tokenizer"] == "hf" and "tokenizer_json" not in meta:
        # the tokenizer itself goes into the meta, so that checkpoints (which keep the meta) carry it
        tok_path = os.path.join(data_dir, meta.get("tokenizer_file", "tokenizer.json"))
        try:
            meta["tokenizer_json"] = Path(tok_path).read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"{path} names tokenizer file {tok_path}, which could not be read "
                            f"({e.strerror or e}); re-run the dataset's prepare.py")
        held = hf_meta(meta["tokenizer_json"], tok_path)["vocab_size"]
        if held != meta["vocab_size"]:
            raise UserError(f"{path} says vocab_size {meta['vocab_size']}, but its tokenizer file {tok_path} has "
                            f"{held} tokens; re-run the dataset's prepare.py")
    return meta


def nanogpt_char_meta(meta, path):
    """nanoGPT's character meta.pkl (itos {id: char} or a list) in meta.json's layout; check_meta checks the rest."""
    def bad(what):
        raise UserError(f"{path}: {what}; re-run the dataset's prepare.py")
    itos = meta["itos"]
    if isinstance(itos, dict):
        if not all(type(i) is int and i >= 0 for i in itos):
            bad(f"itos's keys must be token ids (ints from 0), not {sorted(map(repr, itos))[:5]}")
        vocab = meta.get("vocab_size")
        missing = next((i for i in range(max(len(itos), vocab if type(vocab) is int else 0)) if i not in itos), None)
        if missing is not None:
            bad(f"itos has no character for id {missing}: it needs one single character for each id from 0")
        itos = [itos[i] for i in range(len(itos))]  # the keys are exactly 0..len-1 now
    elif not isinstance(itos, list):
        bad(f"itos is a {type(itos).__name__}, neither {{id: character}} (nanoGPT's) nor a list of characters")
    out = {"tokenizer": "char", "vocab_size": meta.get("vocab_size"), "itos": itos}
    if "stoi" in meta:
        out["stoi"] = meta["stoi"]  # check_meta checks that it is itos's inverse
    return out


TOKENIZERS = ("char", "gpt2", "hf")  # what meta.json's "tokenizer" may say (gpt/data/tokenizer.py reads each)
GPT2_VOCAB = 50257  # GPT-2 BPE's tokens, <|endoftext|> included


def check_meta(meta, path):
    """One line for metadata that would train silently wrong (docs/data.md#checks-before-training)."""
    def bad(what):
        raise UserError(f"{path}: {what}; re-run the dataset's prepare.py")
    kind, vocab = meta["tokenizer"], meta["vocab_size"]
    if not isinstance(kind, str) or kind not in TOKENIZERS:
        bad(f"unknown tokenizer {kind!r} (known: {', '.join(TOKENIZERS)})")
    if not isinstance(meta["dtype"], str) or meta["dtype"] not in DTYPES:
        bad(f"unknown dtype {meta['dtype']!r} (known: {', '.join(DTYPES)})")
    if not isinstance(meta.get("tokenizer_file", ""), str) or not isinstance(meta.get("tokenizer_json", ""), str):
        bad("tokenizer_file and tokenizer_json, where given, must be text")
    if vocab - 1 > np.iinfo(DTYPES[meta["dtype"]]).max:
        bad(f"vocab_size {vocab} does not fit dtype {meta['dtype']}")
    if kind == "gpt2" and vocab != GPT2_VOCAB:
        bad(f"tokenizer gpt2 has {GPT2_VOCAB} tokens, but vocab_size says {vocab}")
    if kind == "hf" and meta.get("eot") is not None and not (type(meta["eot"]) is int and 0 <= meta["eot"] < vocab):
        bad(f"eot {meta['eot']!r} is not a token id below vocab_size {vocab}")
    if kind != "char":
        return
    itos = meta.get("itos")
    if not isinstance(itos, list) or not all(isinstance(ch, str) and len(ch) == 1 for ch in itos):
        bad("tokenizer char needs 'itos', a list of single characters (the character of each id)")
    if len(itos) != vocab:
        bad(f"vocab_size says {vocab}, but itos has {len(itos)} characters")
    if len(set(itos)) != len(itos):
        twice = next(ch for i, ch in enumerate(itos) if ch in itos[:i])
        bad(f"itos holds {twice!r} more than once, so text cannot be encoded back to its ids")
    stoi = meta.get("stoi")
    if stoi is not None and stoi != {ch: i for i, ch in enumerate(itos)}:
        bad("stoi is not the inverse of itos")


def open_tokens(path, dtype="uint16"):
    """A read-only memmap over a .bin file, after checking it is a whole number of tokens and not empty."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    check_readable(path)
    size = os.path.getsize(path)
    if size == 0:
        raise UserError(f"{path} is empty; re-run the dataset's prepare.py")
    if size % itemsize:
        raise UserError(f"{path} is {size} bytes, not a whole number of {dtype} tokens "
                        f"(truncated or not a {dtype} token file); re-run the dataset's prepare.py")
    return np.memmap(path, dtype=DTYPES[dtype], mode="r")


# llm.c's shard format, so its tools (and build-nanogpt's loader, after skipping the header) read our shards
SHARD_MAGIC = 20240520
SHARD_HEADER_INTS = 256
SHARD_VERSIONS = {1: "uint16", 2: "uint32"}


def open_shard(path):
    """A read-only memmap over a shard's tokens (llm.c's .bin, checked whole, or build-nanogpt's .npy)."""
    check_readable(path, "token shard")
    if str(path).endswith(".npy"):  # build-nanogpt's fineweb.py's np.save of a uint16 array
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise UserError(f"{path} is not a readable .npy token shard ({e}); re-run the dataset's prepare script")
        if tokens.ndim != 1 or tokens.dtype.kind != "u" or tokens.dtype.itemsize not in (2, 4):
            raise UserError(f"{path} holds a {tokens.dtype} array of shape {tokens.shape}, not a 1-D uint16/uint32 "
                            f"array of token ids (build-nanogpt's fineweb.py format)")
        return tokens
    header_bytes, size = SHARD_HEADER_INTS * 4, os.path.getsize(path)
    if size < header_bytes:
        raise UserError(f"{path} is not a token shard: {size} bytes, shorter than the {header_bytes}-byte header")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise UserError(f"{path} is not a token shard: bad magic {header[0]} (expected {SHARD_MAGIC})")
    version, count = int(header[1]), int(header[2])
    if version not in SHARD_VERSIONS:
        raise UserError(f"{path}: unknown shard version {version} (known: 1 for uint16 tokens, 2 for uint32)")
    dtype = np.dtype(DTYPES[SHARD_VERSIONS[version]]).newbyteorder("<")
    if size != header_bytes + count * dtype.itemsize:
        held = (size - header_bytes) // dtype.itemsize
        problem = "truncated" if held < count else "corrupt (longer than its header says)"
        raise UserError(f"{path} is {problem}: header says {count} tokens, file holds {held}; "
                        f"re-run the dataset's prepare.py")
    if count == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map zero bytes
    return np.memmap(path, dtype=dtype, mode="r", offset=header_bytes, shape=(count,))


def list_shards(data_dir, split):
    """The split's shards (llm.c's `*_{split}_*.bin`, build-nanogpt's `.npy`) in name order, the data's order."""
    pattern = os.path.join(glob.escape(data_dir), f"*_{split}_*")
    return sorted(glob.glob(pattern + ".bin") + glob.glob(pattern + ".npy"))


def describe_dataset(data_dir, meta):
    """One line on what a dataset folder holds: each split's shards (or .bin file) and tokens, the vocabulary."""
    parts = []
    for split in ("train", "val"):
        if shards := list_shards(data_dir, split):
            n = sum(len(open_shard(path)) for path in shards)
            parts.append(f"{split} {len(shards)} shard{'s' * (len(shards) != 1)}, {n:,} tokens")
        elif os.path.isfile(os.path.join(data_dir, f"{split}.bin")):
            itemsize = np.dtype(DTYPES.get((meta or {}).get("dtype"), np.uint16)).itemsize
            parts.append(f"{split}.bin {os.path.getsize(os.path.join(data_dir, f'{split}.bin')) // itemsize:,} tokens")
    vocab = f", vocab_size {meta['vocab_size']:,} ({meta['tokenizer']})" if meta else ", GPT-2 BPE (no meta.json)"
    return f"data: {'; '.join(parts) or 'no token files'} in {data_dir}{vocab}"


# datasets built by a developer tool instead of a data/<dataset>/prepare.py: the speedrun's measurement corpus
DEV_BUILDERS = {"techdocs": "dev/techdocs.py"}


def prepare_hint(dataset):
    """The command that prepares `dataset`, or the choices when it has no prepare script (or is '')."""
    if is_dataset_name(dataset) and os.path.isfile(os.path.join(REPO, "data", dataset, "prepare.py")):
        return f"python data/{dataset}/prepare.py"
    if dataset in DEV_BUILDERS and os.path.isfile(os.path.join(REPO, DEV_BUILDERS[dataset])):
        return f"python {DEV_BUILDERS[dataset]}"
    # the datasets with a data/*/prepare.py beside train.py (none for an installed package)
    scripts = glob.glob(os.path.join(glob.escape(REPO), "data", "*", "prepare.py"))
    choices = sorted(os.path.basename(os.path.dirname(path)) for path in scripts if os.path.isfile(path))
    return (f"python data/<{'|'.join(choices)}>/prepare.py" if choices
            else "the prepare.py of a dataset in the checkout's data/ folder")


def dataset_dir(dataset):
    """data/<dataset> in the repository, beside train.py (where nanoGPT keeps datasets too). The name is a
    plain folder name: it also comes from checkpoints, whose recorded name must not read from elsewhere."""
    if not is_dataset_name(dataset):
        raise UserError(f"dataset {dataset!r} (a setting, or the one a checkpoint records) is not the name of a "
                        f"folder in data/: it must be a plain name like 'shakespeare_char', without '/', '..' or an "
                        f"absolute path (train.py takes a folder elsewhere as --data_dir)")
    return os.path.join(REPO, "data", dataset)


def is_dataset_name(dataset):
    return (isinstance(dataset, str) and dataset not in ("", ".", "..") and "\0" not in dataset
            and not any(sep and sep in dataset for sep in (os.sep, os.altsep, "/")))


def check_output_file(path, option, make_folder=False):
    """One line, before any work, when a script could not write its output file `path` (the value of
    `option`); with make_folder the script makes its folder, so the nearest existing one must be a folder."""
    path = os.fspath(path)
    if not path:
        raise UserError(f"{option} is empty: name the file to write")
    if os.path.isdir(path):
        raise UserError(f"{option}={path} is a folder: name the file to write (it may be in that folder)")
    folder = os.path.dirname(os.path.abspath(path))
    folder = nearest_existing(folder) if make_folder else folder
    if not os.path.isdir(folder):
        problem = "is not a folder" if os.path.lexists(folder) else "does not exist"
        raise UserError(f"{option}={path}: its folder {folder} {problem}: create it or choose another {option}")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UserError(f"{option}={path} cannot be written (no permission): choose another {option}")
    return path


def dataset_label(dataset, data_dir=""):
    return f"data_dir {data_dir}" if data_dir else f"dataset '{dataset}'"


def find_dataset(dataset, data_dir="", verbose=False, named=True):
    """A dataset's folder (data_dir, or data/<dataset>), its metadata (None: GPT-2 BPE in uint16) and its prepare
    command; one line if missing. verbose: print what it holds; named: the user chose `dataset` (not a default)."""
    label = dataset_label(dataset, data_dir)
    if data_dir:  # the named dataset's script (else the choices), writing into the folder
        hint = f"{prepare_hint(dataset if named else '')} --out_dir={data_dir}"
    else:
        data_dir, hint = dataset_dir(dataset), prepare_hint(dataset)
    if not os.path.isdir(data_dir):
        raise UserError(f"{label} not found: no folder {data_dir} (prepare one with `{hint}`, "
                        f"or point --data_dir at a folder of train.bin/val.bin or token shards)")
    meta = read_meta(data_dir)
    if verbose:
        print(describe_dataset(data_dir, meta))
    for split in ("train", "val"):  # here, before the run plan reads a checkpoint or names a download
        if not list_shards(data_dir, split) and not os.path.exists(os.path.join(data_dir, f"{split}.bin")):
            raise UserError(f"{label} has no {split} split in {data_dir} (no {split}.bin, no "
                            f"*_{split}_* shards): prepare it with `{hint}`")
    return data_dir, meta, hint
