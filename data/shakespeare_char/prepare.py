"""
Prepare the tiny Shakespeare dataset for character-level language modeling: every distinct character is a
token. Writes train.bin and val.bin (uint16 token ids) and meta.json (the character of each id).

    python data/shakespeare_char/prepare.py [--input input.txt] [--out_dir data/shakespeare_char]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from gpt.data.sources import make_out_dir, say_next, script_options, tiny_shakespeare, write_splits
from gpt.data.tokenizer import Tokenizer, char_meta
from gpt.runtime.errors import UserError

parser = script_options(__doc__)
parser.add_argument("--input", help="local text file (default: <out_dir>/input.txt, downloaded if missing)")
HERE = os.path.dirname(os.path.abspath(__file__))
parser.add_argument("--out_dir", default=HERE)
args = parser.parse_args()
make_out_dir(args.out_dir)

data, input_file_path = tiny_shakespeare(args.input, args.out_dir)
if len(data) < 2:
    raise UserError(f"{input_file_path} holds {len(data)} characters; need at least 2 for a train/val split")
print(f"length of dataset in characters: {len(data):,}")

# the vocabulary is every character that occurs in the text
meta = char_meta(data)
print("all the unique characters:", "".join(meta["itos"]))
print(f"vocab size: {meta['vocab_size']:,}")
tok = Tokenizer("char", meta["itos"])

cut = int(len(data) * 0.9)
train_data, val_data = data[:cut], data[cut:]
train_ids, val_ids = tok.encode(train_data), tok.encode(val_data)
print(f"train has {len(train_ids):,} tokens\nval has {len(val_ids):,} tokens")

write_splits(args.out_dir, meta, train_ids, val_ids, f" ({meta['vocab_size']} characters)")
say_next("config/train_shakespeare_char.py", args.out_dir, HERE)
