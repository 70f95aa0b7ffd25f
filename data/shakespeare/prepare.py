"""
Prepare the tiny Shakespeare dataset with GPT-2's BPE tokenizer, or with a Hugging Face `tokenizers` BPE
trained on its own text, or with any tokenizer.json. Writes train.bin and val.bin (token ids, uint16 for
vocabularies up to 65,536, else uint32) and meta.json (plus tokenizer.json for the last two).

    python data/shakespeare/prepare.py [--input input.txt] [--out_dir data/shakespeare]
    python data/shakespeare/prepare.py --tokenizer=train --vocab_size=4096 --out_dir data/shakespeare_bpe
    python data/shakespeare/prepare.py --tokenizer=path/to/tokenizer.json --out_dir data/shakespeare_mytok
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # repo root
from gpt.data.sources import make_out_dir, say_next, script_options, tiny_shakespeare, write_splits
from gpt.data.tokenizer import dataset_tokenizer
from gpt.runtime.errors import UserError

parser = script_options(__doc__)
parser.add_argument("--input", help="local text file (default: <out_dir>/input.txt, downloaded if missing)")
HERE = os.path.dirname(os.path.abspath(__file__))
parser.add_argument("--out_dir", default=HERE)
parser.add_argument("--tokenizer", default="gpt2",
                    help="gpt2, train (a byte-level BPE trained on the train split), or a tokenizers JSON file")
parser.add_argument("--vocab_size", type=int, default=4096, help="vocabulary of --tokenizer=train")
args = parser.parse_args()
make_out_dir(args.out_dir)

data, input_file_path = tiny_shakespeare(args.input, args.out_dir)
cut = int(len(data) * 0.9)
train_data, val_data = data[:cut], data[cut:]

# encode (GPT-2 BPE by default); encode_ordinary treats a literal "<|endoftext|>" in the text as plain text
tok, meta = dataset_tokenizer(args.tokenizer, args.out_dir, lambda: [train_data], args.vocab_size)
train_ids, val_ids = tok.encode_ordinary(train_data), tok.encode_ordinary(val_data)
print(f"train has {len(train_ids):,} tokens\nval has {len(val_ids):,} tokens")
if not train_ids or not val_ids:
    raise UserError(f"{input_file_path} is too short to give both a train and a val split any tokens")

write_splits(args.out_dir, meta, train_ids, val_ids)
# GPT-2's tokens fine-tune GPT-2 (the config reads data/shakespeare); a tokenizer of its own trains a new model
if args.tokenizer == "gpt2":
    say_next("config/finetune_shakespeare.py", args.out_dir, HERE)
else:
    print(f"next: python train.py config/train_text.py --data_dir={args.out_dir} --out_dir=out-shakespeare-bpe")
