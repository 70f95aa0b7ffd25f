"""What only the prepare scripts (data/*/prepare.py) use: the writers of the on-disk format that gpt/data reads, their
text sources (tiny Shakespeare's download, text files, local files and Hugging Face datasets through `datasets`), and
the steps several scripts share (their options, the last lines they print)."""
import argparse
import bz2
import gzip
import json
import lzma
import os
import sys
import urllib.request

import numpy as np

from gpt.data import DTYPES, SHARD_HEADER_INTS, SHARD_MAGIC, SHARD_VERSIONS
from gpt.runtime.errors import UserError, install
from gpt.runtime.files import atomic_write

# --- writers


def _fitting(ids, dtype):
    ids, limit = np.asarray(ids), np.iinfo(DTYPES[dtype]).max
    if ids.size and (ids.min() < 0 or ids.max() > limit):
        raise ValueError(f"token id {ids.max()} does not fit {dtype} (max {limit})")
    return ids


def write_tokens(path, ids, dtype="uint16"):
    ids = _fitting(ids, dtype)
    with atomic_write(path) as f:
        f.write(ids.astype(DTYPES[dtype]).tobytes())


def write_meta(data_dir, meta):
    with atomic_write(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)


def write_shard(path, tokens, dtype="uint16"):
    """Write a token shard (header + tokens) atomically, after checking every id fits the storage dtype."""
    tokens = _fitting(tokens, dtype)
    if tokens.size >= 2**31:
        raise ValueError(f"{tokens.size} tokens do not fit one shard (the header's count is an int32)")
    header = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    header[:3] = SHARD_MAGIC, {v: k for k, v in SHARD_VERSIONS.items()}[dtype], tokens.size
    with atomic_write(path) as f:
        f.write(header.tobytes())
        f.write(np.ascontiguousarray(tokens, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<")).data)


def script_options(doc):
    """A prepare script's argument parser, its docstring the description; from here on a mistake is one line."""
    install()
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def make_out_dir(path):
    """A prepare script's --out_dir, made if missing; one line when it cannot be (a file there, no permission)."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise UserError(f"--out_dir {path} is a file, not a folder: choose another --out_dir") from None
    except OSError as e:
        raise UserError(f"cannot create --out_dir {path} ({e.strerror or e}): choose another --out_dir") from None


def write_splits(out_dir, meta, train_ids, val_ids, note=""):
    for split, ids in (("train", train_ids), ("val", val_ids)):
        write_tokens(os.path.join(out_dir, f"{split}.bin"), ids, meta["dtype"])
    finish(out_dir, meta, len(train_ids), len(val_ids), note)


def finish(out_dir, meta, n_train, n_val, note=""):
    """Write meta.json, last (a folder with meta.json is a finished dataset), and say what the folder holds."""
    write_meta(out_dir, meta)
    print(f"wrote {out_dir}: train.bin ({n_train:,} tokens), val.bin ({n_val:,}), meta.json"
          + (", tokenizer.json" if "tokenizer_file" in meta else "") + note)


EIGHT_GPUS = "  (8 GPUs: torchrun --standalone --nproc_per_node=8 train.py ...)"  # say_next's `after` for GPT-2


def say_next(config, out_dir, here, after=""):
    """The last line, the command that trains on the data: the config reads `here`, data elsewhere gets --data_dir."""
    elsewhere = "" if os.path.abspath(out_dir) == here else f" --data_dir={out_dir}"
    print(f"next: python train.py {config}{elsewhere}{after}")


# --- sources: tiny Shakespeare, text files

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def tiny_shakespeare(input_path, out_dir):
    """The Shakespeare prepare scripts' text and its file: --input `input_path`, else `out_dir`/input.txt,
    downloaded first when missing (atomically, so a cut-off download is never mistaken for the whole text)."""
    path = input_path or os.path.join(out_dir, "input.txt")
    if input_path is None and not os.path.exists(path):
        print(f"downloading {TINY_SHAKESPEARE_URL}")
        try:
            with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=60) as r:
                text = r.read()
        except OSError as e:
            raise UserError(f"could not download {TINY_SHAKESPEARE_URL} ({e}); "
                            f"pass --input with a local copy of tinyshakespeare's input.txt")
        with atomic_write(path) as f:
            f.write(text)
    if os.path.isdir(path):
        raise UserError(f"input file {path} is a folder: give the text file itself (data/text/prepare.py "
                        f"takes folders)")
    if not os.path.isfile(path):
        raise UserError(f"input file {path} does not exist")
    return read_text(path), path


# compressed text reads as its text: the openers of the standard library, by the file's last extension
COMPRESSED = {".gz": gzip, ".bz2": bz2, ".xz": lzma}


def read_text(path, encoding="utf-8", errors="strict"):
    """A text file's text, exactly (\r\n stays \r\n, so decoding the tokens gives back the file byte for
    byte), also gzip, bz2 or xz compressed; one line when it is damaged or not text in `encoding`."""
    kind = COMPRESSED.get(os.path.splitext(path)[1].lower())
    try:
        with (kind.open if kind else open)(path, "rt", encoding=encoding, errors=errors, newline="") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not {encoding} text ({e.reason} at byte {e.start}"
                        f"{' of its uncompressed text' if kind else ''}): convert it, leave it out, or pass "
                        f"--errors=replace (U+FFFD for each byte that does not decode)")
    except (OSError, EOFError) as e:  # a damaged or cut-off archive (gzip.BadGzipFile, lzma.LZMAError are OSErrors)
        raise UserError(f"{path} could not be read ({e})" + (f": its {kind.__name__} data is damaged" if kind else ""))


# --- sources: local files and Hugging Face datasets (the scripts that read documents: fineweb, openwebtext)

def add_document_options(parser, dataset, local_flags=("--local",)):
    parser.add_argument("--dataset", default=dataset, help="HF hub dataset id (its 'train' split)")
    parser.add_argument(*local_flags, dest="local", help="local file or folder to read instead of the hub")
    parser.add_argument("--text_column", default="text")
    parser.add_argument("--streaming", action="store_true", help="read the documents as they download instead of "
                        "caching the whole dataset first (the same output: documents are taken in order either way)")
    parser.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="worker processes for loading and tokenizing (a good number is about half your cores)")


def check_document_options(args):
    """One line, before anything heavy is imported, for add_document_options' mistakes."""
    if args.num_proc < 1:
        raise UserError(f"--num_proc must be at least 1, got {args.num_proc}")
    if args.local is not None and not os.path.exists(args.local):
        raise UserError(f"--local path {args.local} does not exist")


def say_skipped(n, text_column):
    """Rows whose text column held no text (every document has at least its end-of-text token)."""
    if n:
        print(f"skipped {n:,} row(s) whose {text_column!r} is missing, null or not text")


# how each kind of local file is read by `datasets` (compressed ones too: .jsonl.gz, .csv.xz, ...)
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
# what a save_to_disk DatasetDict may call its validation split, in order of preference
VAL_SPLITS = ("validation", "val", "test")


def _kind(path):
    base = path[:-len(ext)] if (ext := next((c for c in COMPRESSIONS if path.endswith(c)), "")) else path
    return LOCAL_BUILDERS.get(os.path.splitext(base)[1])


def import_datasets():
    """The optional `datasets` package (its absence is one line), progress bars off where stderr is no terminal."""
    try:
        import datasets  # here, not at the top: it is slow to import, and optional
    except ModuleNotFoundError as e:
        if e.name != "datasets":
            raise
        raise UserError("reading documents needs the datasets package (Hugging Face): pip install datasets")
    if not sys.stderr.isatty():
        datasets.disable_progress_bars()
    return datasets


def load_local_splits(path, num_proc=1, streaming=False):
    """A prepare script's existing --local documents (docs/data.md#preparing-data) as (train, val) datasets.Datasets in
    file order (IterableDatasets with streaming); val is None unless a save_to_disk folder has one."""
    datasets = import_datasets()
    if os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")):
        ds, val = datasets.load_from_disk(path), None
        if isinstance(ds, datasets.DatasetDict):
            val_name = next((name for name in VAL_SPLITS if name in ds), None)
            others = [name for name in ds if name != val_name]
            if "train" not in ds and len(others) != 1:
                raise UserError(f"{path} has splits {list(ds)}; none is 'train' - save the one to use on its own")
            if val_name:
                val = ds[val_name]
                print(f"using {path}'s '{val_name}' split ({len(val):,} documents) as val, "
                      f"rather than cutting val from train")
            ds = ds["train"] if "train" in ds else ds[others[0]]
        if streaming:  # already on disk: streaming saves nothing, but the caller reads it the same way
            ds, val = ds.to_iterable_dataset(), val and val.to_iterable_dataset()
        return ds, val
    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, f) for f in os.listdir(path) if _kind(f))
    kinds = {_kind(f) for f in files}
    if not files or None in kinds or len(kinds) > 1:
        raise UserError(f"--local {path}: expected one kind of {'/'.join(LOCAL_BUILDERS)} files (or those "
                        f"compressed: {'/'.join(COMPRESSIONS)}) or a save_to_disk folder")
    kind = kinds.pop()
    options = {"streaming": True} if streaming else {"num_proc": min(num_proc, len(files))}
    if kind == "text":
        options["sample_by"] = "document"  # a whole .txt file is one document
    try:
        return datasets.load_dataset(kind, data_files=files, split="train", **options), None
    except datasets.exceptions.DatasetGenerationError as e:  # a file that is not what its name says
        cause = e.__cause__ or e
        raise UserError(f"--local {path}: could not read it as {kind} ({type(cause).__name__}: "
                        f"{' '.join(str(cause).split())[:300]})") from None


def load_documents(local, dataset, text_column, num_proc=1, subset=None, streaming=False, with_val=False):
    """A prepare script's documents: its --local files (load_local_splits), else the hub dataset's 'train'
    split, checked to have the text column; with_val: (train, val), as load_local_splits gives them."""
    datasets = import_datasets()
    if local is not None:
        ds, val = load_local_splits(local, num_proc, streaming)
    else:
        options = {"streaming": True} if streaming else {"num_proc": num_proc}
        try:
            ds, val = datasets.load_dataset(dataset, name=subset, split="train", **options), None
        except (OSError, ValueError) as e:  # no network, unknown id or subset, no access
            of = "" if subset is None else f" (subset {subset!r})"
            raise UserError(f"could not load dataset {dataset!r}{of} from the HF hub "
                            f"({' '.join(str(e).split())}); pass --local with local files instead")
    if (columns := ds.column_names) is None:  # a stream that does not know its columns before its first row
        columns = list(next(iter(ds)).keys())
    if text_column not in columns:
        raise UserError(f"the dataset has no column {text_column!r} (columns: {columns}); pick one with --text_column")
    if val is not None and text_column not in (val.column_names or [text_column]):
        raise UserError(f"the dataset's val split has no column {text_column!r} (columns: {val.column_names})")
    return (ds, val) if with_val else ds
