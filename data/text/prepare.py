"""
Prepare your own text for training: one file, several files, or a folder of text files, tokenized by
characters, GPT-2 BPE, a BPE trained on the text, or an existing tokenizers JSON file. Writes
data/<name>/train.bin, val.bin and meta.json (and tokenizer.json for a BPE of its own).

    python data/text/prepare.py --input my_novel.txt --name novel                   # characters
    python data/text/prepare.py --input notes/ --name notes --tokenizer=train       # a BPE of its own
    python data/text/prepare.py --input a.md b.md --name ab --tokenizer=gpt2
    python train.py config/train_text.py --dataset=novel --out_dir=out-novel
    python sample.py --out_dir=out-novel

Each file is one document, a folder's text files (recursively) taken in path order; the rest is in
docs/data.md#your-own-text.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from gpt.data import dataset_dir
from gpt.data.sources import COMPRESSED, make_out_dir, read_text, script_options, write_splits
from gpt.data.tokenizer import Tokenizer, char_meta, dataset_tokenizer
from gpt.runtime.errors import UserError

# what a folder's text files may be called (a file named on the command line may be called anything)
TEXT_EXTENSIONS = (".txt", ".md", ".markdown", ".rst", ".text", ".tex", ".org", ".adoc")
BLOCK_SIZE = 256  # the default context: config/train_text.py's block_size


def is_text_name(name):
    """Whether a file in a folder is text by its name: a text extension, compressed or not (notes.md.gz)."""
    stem, ext = os.path.splitext(name.lower())
    return (stem if ext in COMPRESSED else name.lower()).endswith(TEXT_EXTENSIONS)


def text_files(inputs):
    """The files of --input in order: each file as given, each folder's text files (recursively, not hidden) by path."""
    files = []
    for path in inputs:
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found += [os.path.join(root, n) for n in names if not n.startswith(".") and is_text_name(n)]
            if not found:
                raise UserError(f"--input {path}: the folder holds no text files ({', '.join(TEXT_EXTENSIONS)})")
            files += sorted(found)
        else:
            raise UserError(f"--input {path} does not exist")
    return files


def main(argv=None):
    parser = script_options(__doc__)
    parser.add_argument("--input", nargs="+", help="text files and/or folders of text files")
    parser.add_argument("--name", help="the dataset's name: writes data/<name>/, trained with --dataset=<name>")
    parser.add_argument("--out_dir", help="write here instead of data/<name>/ (then train with --data_dir)")
    parser.add_argument("--tokenizer", default="char", help="char (default), gpt2, train (a byte-level BPE trained on "
                        "this text), or the path of a tokenizers JSON file")
    parser.add_argument("--vocab_size", type=int, default=4096, help="vocabulary of --tokenizer=train")
    parser.add_argument("--encoding", default="utf-8", help="the files' text encoding (e.g. latin-1)")
    parser.add_argument("--errors", default="strict", choices=("strict", "replace"),
                        help="bytes that do not decode: strict stops with an error, replace makes each U+FFFD")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="the share of tokens kept for val")
    parser.add_argument("--block_size", type=int, default=BLOCK_SIZE,
                        help="the context you will train with: val and train get at least one window each")
    args = parser.parse_args(argv)
    if not args.input:
        raise UserError("no --input: give a text file, several, or a folder (--input my.txt or --input texts/)")
    if not args.name and not args.out_dir:
        raise UserError("no --name: name the dataset, e.g. --name=mytext (writes data/mytext/; "
                        "train with --dataset=mytext)")
    if args.name and (os.sep in args.name or "/" in args.name or args.name in (".", "..")):
        raise UserError(f"--name {args.name!r} must be a plain folder name (use --out_dir for a path)")
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    if args.block_size < 1:
        raise UserError(f"--block_size must be at least 1, got {args.block_size}")
    try:
        "".encode(args.encoding)
    except LookupError:
        raise UserError(f"--encoding {args.encoding!r} is not a text encoding Python knows (e.g. utf-8, latin-1)")
    out_dir = args.out_dir or dataset_dir(args.name)

    files = text_files(args.input)
    docs = [read_text(f, args.encoding, args.errors) for f in files]
    if args.errors == "replace":
        print(f"{sum(doc.count(chr(0xFFFD)) for doc in docs):,} U+FFFD characters in the text (each byte that "
              f"did not decode is one)")
    if not any(docs):
        raise UserError(f"the {len(files)} input file(s) hold no text")
    print(f"{len(files):,} file(s), {sum(map(len, docs)):,} characters")

    # the tokenizer, saved with the data; a trained one (and the character table) sees all the text: with a
    # small corpus, a val part that the tokenizer never saw would only get worse tokens, not a fairer loss
    if args.tokenizer == "char":
        meta = char_meta("".join(docs))
        tok = Tokenizer("char", meta["itos"])
        print(f"characters: {meta['vocab_size']:,} distinct")
    else:
        tok, meta = dataset_tokenizer(args.tokenizer, out_dir, lambda: iter(docs), args.vocab_size)
    eot = meta.get("eot")
    if eot is None and args.tokenizer != "char" and len(docs) > 1:
        print("the tokenizer has no end-of-text token: the documents are joined without a separator")

    ids = []
    for doc in docs:
        ids += tok.encode_ordinary(doc)  # "<|endoftext|>" written in a file is text, not the separator
        if eot is not None:
            ids.append(eot)
    need = 2 * (args.block_size + 1)
    if len(ids) < need:
        raise UserError(f"the text is {len(ids):,} tokens, too few for block_size={args.block_size} (train and "
                        f"val need {args.block_size + 1} each, {need} in all): add text, or pass a smaller "
                        f"--block_size and train with the same --block_size")
    n_val = min(max(int(len(ids) * args.val_fraction), args.block_size + 1), len(ids) - (args.block_size + 1))
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]

    make_out_dir(out_dir)
    write_splits(out_dir, meta, train_ids, val_ids, f" ({args.tokenizer} tokenizer, {meta['vocab_size']:,} tokens)")
    where = f"--data_dir={out_dir}" if args.out_dir else f"--dataset={args.name} --out_dir=out-{args.name}"
    # config/train_text.py's context is the default --block_size: a smaller one must be trained with too
    context = f" --block_size={args.block_size}" if args.block_size != BLOCK_SIZE else ""
    print(f"next: python train.py config/train_text.py {where}{context}")


if __name__ == "__main__":
    main()
