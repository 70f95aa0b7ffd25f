"""
Prepare FineWeb-Edu (or any text dataset) as token shards for GPT-2 training, the build-nanogpt / llm.c way:
GPT-2 BPE tokens, each document PRECEDED by <|endoftext|> (50256), cut into shards of --shard_size tokens
in llm.c's format (datafiles.write_shard). The first shard is val, the rest train:

    fineweb_val_000000.bin, fineweb_train_000001.bin, fineweb_train_000002.bin, ...   plus meta.json

    python data/fineweb/prepare.py                                    # HuggingFaceFW/fineweb-edu, sample-10BT
    python data/fineweb/prepare.py --subset sample-100BT
    python data/fineweb/prepare.py --dataset HuggingFaceFW/fineweb --subset sample-10BT
    python data/fineweb/prepare.py --local docs.jsonl                 # or local jsonl/json/parquet/txt files,
    python data/fineweb/prepare.py --local some/folder                # a folder of them, or a save_to_disk folder

Re-running keeps every shard that already holds its tokens, so an interrupted run is finished by starting
it again (data/fineweb/readme.md).
"""
import multiprocessing
import os
import sys
from contextlib import suppress

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from gpt.data import open_shard, read_meta, sources
from gpt.data.tokenizer import gpt2_encoding
from gpt.runtime.errors import UserError

HERE = os.path.dirname(os.path.abspath(__file__))


def tokenize(text):
    # runs in the pool's workers; gpt2_encoding() is cached per process
    if not isinstance(text, str):  # a row without the column (null), or a number: no document, counted
        return np.zeros(0, dtype=np.uint16)
    enc = gpt2_encoding()  # its ids are below 50257 (gpt2_encoding checks a local ranks file), so fit uint16
    return np.array([enc.eot_token] + enc.encode_ordinary(text), dtype=np.uint16)  # eot delimits all documents


def shard_path(out_dir, index):
    return os.path.join(out_dir, f"fineweb_{'val' if index == 0 else 'train'}_{index:06d}.bin")


def save(path, tokens):
    """Write the shard, unless the one at path is complete and holds exactly these tokens already."""
    kept = False  # missing, truncated or foreign: (re)written
    with suppress(UserError):
        kept = np.array_equal(open_shard(path), tokens)
    if not kept:
        sources.write_shard(path, tokens, "uint16")  # atomic: a temporary name, renamed when complete
    print(f"{os.path.basename(path)}: {len(tokens):,} tokens ({'unchanged' if kept else 'written'})")


def main():
    parser = sources.script_options(__doc__)
    sources.add_document_options(parser, "HuggingFaceFW/fineweb-edu")
    parser.add_argument("--subset", default="sample-10BT", help="the hub dataset's subset (config name)")
    parser.add_argument("--shard_size", type=int, default=100_000_000, help="tokens per shard")
    parser.add_argument("--out_dir", default=HERE)
    args = parser.parse_args()
    sources.check_document_options(args)
    if not 1 <= args.shard_size < 2**31:
        raise UserError(f"--shard_size must be between 1 and 2**31-1 tokens, got {args.shard_size}")
    gpt2_encoding()  # fail now, in one line, if the BPE files are missing - not inside a worker process later

    # from the hub, the parquet files go to the huggingface cache first (unless --streaming)
    dataset = sources.load_documents(args.local, args.dataset, args.text_column, args.num_proc,
                                     subset=args.subset, streaming=args.streaming)

    # fill one shard-sized buffer after another; a document that overflows one continues in the next
    sources.make_out_dir(args.out_dir)
    buf = np.empty(args.shard_size, dtype=np.uint16)
    index, filled, total, bar, skipped = 0, 0, 0, None, 0
    # the documents a batch at a time: much faster than one row at a time, and never the whole column in memory
    column = args.text_column
    documents = (text for batch in dataset.select_columns([column]).iter(batch_size=1024) for text in batch[column])
    with multiprocessing.Pool(args.num_proc) as pool:
        for ids in pool.imap(tokenize, documents, chunksize=16):
            skipped += not len(ids)  # every document has at least its end-of-text token
            while len(ids):
                if bar is None:  # disable=None: no bar when stderr is not a terminal
                    bar = tqdm(total=args.shard_size, unit="tokens", desc=f"shard {index}", disable=None)
                take = min(len(ids), args.shard_size - filled)
                buf[filled:filled + take] = ids[:take]
                filled, total, ids = filled + take, total + take, ids[take:]
                bar.update(take)
                if filled == args.shard_size:
                    bar.close()
                    save(shard_path(args.out_dir, index), buf)
                    index, filled, bar = index + 1, 0, None
    if filled:  # the last shard, shorter
        bar.close()
        save(shard_path(args.out_dir, index), buf[:filled])
        index += 1
    sources.say_skipped(skipped, args.text_column)
    if index == 0:
        raise UserError("the dataset has no documents")
    if index == 1:
        raise UserError(f"the dataset has only {total:,} tokens, all in the val shard and none left for training; "
                        f"lower --shard_size")

    # shards past the last one are from an earlier run with other settings: the loader would read them as data
    stale = index
    while os.path.exists(shard_path(args.out_dir, stale)):
        os.remove(shard_path(args.out_dir, stale))
        print(f"removed {os.path.basename(shard_path(args.out_dir, stale))}, left over from an earlier run")
        stale += 1

    # meta.json last: its presence says the shards are complete
    enc = gpt2_encoding()
    meta = {"tokenizer": "gpt2", "vocab_size": enc.n_vocab, "dtype": "uint16", "eot": enc.eot_token, "format": "shards"}
    old = None  # unreadable: replaced
    with suppress(UserError):
        old = read_meta(args.out_dir)
    if old != meta:  # an unchanged file is left alone, so a re-run changes nothing
        sources.write_meta(args.out_dir, meta)
    val = min(total, args.shard_size)
    print(f"wrote {args.out_dir}: {index} shards, 1 val ({val:,} tokens) and {index - 1} train "
          f"({total - val:,} tokens), meta.json")
    sources.say_next("config/train_gpt2_fineweb.py", args.out_dir, HERE, sources.EIGHT_GPUS)


# the guard matters: multiprocessing's spawn start method (macOS, Windows) re-imports this file in every worker
if __name__ == "__main__":
    main()
