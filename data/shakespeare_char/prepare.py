"""
Prepare the tiny Shakespeare dataset for character-level language modeling: every distinct character is a
token. Writes train.bin and val.bin (uint16 token ids) and meta.json (the character of each id).

    python data/shakespeare_char/prepare.py [--input input.txt] [--out_dir data/shakespeare_char]
"""
import argparse
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
import errors
from atomic import atomic_write
from datafiles import write_meta, write_tokens
from errors import UserError
from tokenizer import Tokenizer, char_meta

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

errors.install()
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--input", help="local text file (default: <out_dir>/input.txt, downloaded if missing)")
parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
args = parser.parse_args()
os.makedirs(args.out_dir, exist_ok=True)

# find the text: --input, else a previous download, else download it (atomically, so a cut-off
# download is never mistaken for the whole text next time)
input_file_path = args.input or os.path.join(args.out_dir, "input.txt")
if args.input is None and not os.path.exists(input_file_path):
    print(f"downloading {URL}")
    try:
        with urllib.request.urlopen(URL, timeout=60) as r:
            text = r.read()
    except OSError as e:
        raise UserError(f"could not download {URL} ({e}); pass --input with a local copy of tinyshakespeare's input.txt")
    with atomic_write(input_file_path) as f:
        f.write(text)
if not os.path.isfile(input_file_path):
    raise UserError(f"input file {input_file_path} does not exist")
try:
    # newline="" keeps \r\n as it is, so decoding the tokens gives back the file byte for byte
    with open(input_file_path, encoding="utf-8", newline="") as f:
        data = f.read()
except UnicodeDecodeError as e:
    raise UserError(f"{input_file_path} is not UTF-8 text ({e})")
if len(data) < 2:
    raise UserError(f"{input_file_path} holds {len(data)} characters; need at least 2 for a train/val split")
print(f"length of dataset in characters: {len(data):,}")

# the vocabulary is every character that occurs in the text
meta = char_meta(data)
print("all the unique characters:", "".join(meta["itos"]))
print(f"vocab size: {meta['vocab_size']:,}")
tok = Tokenizer("char", meta["itos"])

# create the train and test splits
n = len(data)
train_data = data[:int(n * 0.9)]
val_data = data[int(n * 0.9):]

# encode both to integers
train_ids = tok.encode(train_data)
val_ids = tok.encode(val_data)
print(f"train has {len(train_ids):,} tokens")
print(f"val has {len(val_ids):,} tokens")

# export to bin files, then meta.json last: a folder with meta.json is a finished dataset
write_tokens(os.path.join(args.out_dir, "train.bin"), train_ids, meta["dtype"])
write_tokens(os.path.join(args.out_dir, "val.bin"), val_ids, meta["dtype"])
write_meta(args.out_dir, meta)

# length of dataset in characters:  1,115,394
# all the unique characters:
#  !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz
# vocab size: 65
# train has 1,003,854 tokens
# val has 111,540 tokens
