"""
Prepare OpenWebText (or any text dataset) for GPT-2 training: GPT-2 BPE tokens, each document followed by
<|endoftext|> (50256), in train.bin and val.bin (uint16), plus meta.json. Follows nanoGPT's prepare.py.

    python data/openwebtext/prepare.py                         # Skylion007/openwebtext from the HF hub
    python data/openwebtext/prepare.py --local docs.jsonl      # or local jsonl/json/parquet/txt files,
    python data/openwebtext/prepare.py --local some/folder     # a folder of them, or a save_to_disk folder

A .txt file is one document; jsonl/json/parquet rows are documents, their text in --text_column.
--tokenizer replaces GPT-2's BPE (data/openwebtext/readme.md).
"""
import math
import multiprocessing
import os
import sys

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from gpt.data import DTYPES, sources
from gpt.data.tokenizer import dataset_tokenizer, get_tokenizer, gpt2_encoding, hf_tokenizer_file
from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write

parser = sources.script_options(__doc__)
sources.add_document_options(parser, "Skylion007/openwebtext", ("--local", "--input"))
HERE = os.path.dirname(os.path.abspath(__file__))
parser.add_argument("--out_dir", default=HERE)
parser.add_argument("--val_fraction", type=float, default=0.0005)
parser.add_argument("--seed", type=int, default=2357)
parser.add_argument("--tokenizer", default="gpt2",
                    help="gpt2, train (a byte-level BPE trained on the train split), or a tokenizers JSON file")
parser.add_argument("--vocab_size", type=int, default=32768, help="vocabulary of --tokenizer=train")
args = parser.parse_args()
sources.check_document_options(args)
if not 0 < args.val_fraction < 1:
    raise UserError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
if args.tokenizer == "gpt2":
    gpt2_encoding()  # fail now, in one line, if the BPE files are missing - not inside a worker process later
elif args.tokenizer == "train" and args.streaming:
    raise UserError("--streaming cannot train a tokenizer (it learns from the whole train split first): "
                    "drop --streaming, or pass a trained tokenizer.json as --tokenizer")
elif args.tokenizer != "train" and not os.path.isfile(args.tokenizer):
    raise UserError(f"--tokenizer {args.tokenizer}: not gpt2, train, or an existing tokenizers JSON file")

datasets = sources.import_datasets()

dataset, given_val = sources.load_documents(args.local, args.dataset, args.text_column, args.num_proc,
                                            streaming=args.streaming, with_val=True)
if args.streaming:
    split_dataset = None
elif given_val is not None:  # the user's own validation split (a save_to_disk DatasetDict's)
    split_dataset = datasets.DatasetDict(train=dataset, val=given_val)
else:
    if len(dataset) < 2:
        raise UserError(f"the dataset has {len(dataset)} document(s); need at least 2 for a train/val split")
    # owt by default only contains the 'train' split, so create a test split (at least one document)
    split_dataset = dataset.train_test_split(test_size=args.val_fraction, seed=args.seed, shuffle=True)
    split_dataset["val"] = split_dataset.pop("test")  # rename the test split to val

# the tokenizer (a trained one learns from the train split only), saved beside the data before any token
sources.make_out_dir(args.out_dir)
train_texts = lambda: (batch[args.text_column] for batch in split_dataset["train"].iter(batch_size=1000))
_, meta = dataset_tokenizer(args.tokenizer, args.out_dir, train_texts, args.vocab_size)
if meta["eot"] is None:
    raise UserError("the tokenizer has no end-of-text token to separate documents (looked for "
                    "<|endoftext|>, <|end_of_text|>, </s>, <eos>)")
tokenizer_file = os.path.join(args.out_dir, meta.get("tokenizer_file", ""))


# tokenize the dataset; the tokenizer is fetched inside the worker (cached per process) rather than captured,
# so the function pickles small and datasets can fingerprint it for its cache
def process(example):
    text = example[args.text_column]
    if not isinstance(text, str):  # a row without the column (null), or a number: no document; counted below
        return {"ids": [], "len": 0}
    tok = get_tokenizer(None) if meta["tokenizer"] == "gpt2" else hf_tokenizer_file(tokenizer_file, meta["eot"])
    ids = tok.encode_ordinary(text) + [meta["eot"]]  # special tokens in the text are plain text; then the separator
    return {"ids": ids, "len": len(ids)}


def encode_text(text):
    return np.asarray(process({args.text_column: text})["ids"], dtype=DTYPES[meta["dtype"]])


def stream_tokens(stream, path):
    """Tokenize a stream of documents in order into path; the token count of each document."""
    lengths = []
    with atomic_write(path) as f, multiprocessing.Pool(args.num_proc) as pool:
        texts = (row[args.text_column] for row in stream)
        for ids in tqdm(pool.imap(encode_text, texts, chunksize=16), desc="tokenizing", unit="doc", disable=None):
            f.write(ids.tobytes())
            lengths.append(len(ids))
    return np.array(lengths, dtype=np.int64)


if args.streaming:
    # the documents in the source's order, then written in the order the non-streaming path writes them:
    # datasets' train_test_split is rng(seed).permutation(n), its first ceil(n * val_fraction) being val
    tmp_train = os.path.join(args.out_dir, "documents.tmp")
    lengths = stream_tokens(dataset, tmp_train)
    sources.say_skipped(int((lengths == 0).sum()), args.text_column)
    streamed = {"train": (tmp_train, lengths)}
    if given_val is not None:
        tmp_val = os.path.join(args.out_dir, "val_documents.tmp")
        streamed["val"] = (tmp_val, stream_tokens(given_val, tmp_val))
        orders = {split: np.arange(len(lens)) for split, (_, lens) in streamed.items()}
    else:
        if len(lengths) < 2:
            raise UserError(f"the dataset has {len(lengths)} document(s); need at least 2 for a train/val split")
        n_val = math.ceil(args.val_fraction * len(lengths))
        permutation = np.random.default_rng(args.seed).permutation(len(lengths))
        streamed["val"] = streamed["train"]
        orders = {"train": permutation[n_val:], "val": permutation[:n_val]}
    written = {}
    for split in ("train", "val"):
        path, lens = streamed[split]
        docs = np.memmap(path, dtype=DTYPES[meta["dtype"]], mode="r") if lens.sum() else np.zeros(0)
        starts = np.concatenate([[0], np.cumsum(lens)])
        with atomic_write(os.path.join(args.out_dir, f"{split}.bin")) as f:
            for i in orders[split]:
                f.write(np.asarray(docs[starts[i]:starts[i + 1]]).tobytes())
        written[split] = int(lens[orders[split]].sum())
        del docs
    for path in {path for path, _ in streamed.values()}:  # one file when val was cut from train
        os.remove(path)
else:
    tokenized = split_dataset.map(process, remove_columns=dataset.column_names,
                                  desc="tokenizing the splits", num_proc=args.num_proc)
    lengths = {split: np.asarray(dset["len"], dtype=np.int64) for split, dset in tokenized.items()}
    sources.say_skipped(int(sum((lens == 0).sum() for lens in lengths.values())), args.text_column)
    for split, dset in tokenized.items():
        filename = os.path.join(args.out_dir, f"{split}.bin")
        with atomic_write(filename) as f:
            # batch together samples for faster write; disable=None: a bar only on a terminal
            for batch in tqdm(dset.with_format("numpy").iter(batch_size=1024), desc=f"writing {filename}",
                              total=math.ceil(len(dset) / 1024), disable=None):
                f.write(np.concatenate(batch["ids"]).astype(DTYPES[meta["dtype"]]).tobytes())
    written = {split: int(lens.sum()) for split, lens in lengths.items()}
sources.finish(args.out_dir, meta, written["train"], written["val"])
sources.say_next("config/train_gpt2.py", args.out_dir, HERE, sources.EIGHT_GPUS)
