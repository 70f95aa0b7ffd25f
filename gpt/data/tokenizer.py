"""Tokenizers: GPT-2 BPE (tiktoken, online or from a local ranks file), characters, and Hugging Face `tokenizers` JSON
files. train.py and sample.py use get_tokenizer(meta), prepare scripts dataset_tokenizer."""
import base64
import functools
import json
import os
import sys
from contextlib import suppress
from pathlib import Path

import tiktoken

from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write

GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = 50256


def _load_ranks(path):
    # the same parsing as tiktoken.load.load_tiktoken_bpe, minus its cache: that one copies the file into
    # /tmp keyed by path, so a file replaced at the same path would silently keep giving the old ranks
    try:
        contents = Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"GPT2_TIKTOKEN_FILE={path} could not be read ({e.strerror or e})")
    ranks = {}
    try:
        for line in contents.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except ValueError:
        raise UserError(f"GPT2_TIKTOKEN_FILE={path} is not a tiktoken ranks file "
                        f"(bad line {line[:60]!r}; expected 'base64(token_bytes) rank')")
    if len(ranks) != GPT2_EOT or max(ranks.values()) != GPT2_EOT - 1:
        raise UserError(f"GPT2_TIKTOKEN_FILE={path} has {len(ranks)} ranks, not GPT-2's {GPT2_EOT}")
    return ranks


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """GPT-2's BPE as a tiktoken.Encoding: from $GPT2_TIKTOKEN_FILE if set, else tiktoken's download."""
    if path := os.environ.get("GPT2_TIKTOKEN_FILE"):
        return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=_load_ranks(path),
                                 special_tokens={"<|endoftext|>": GPT2_EOT})
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests/urllib/blobfile errors differ; all mean the files could not be fetched
        raise UserError(f"GPT-2 BPE files could not be downloaded ({type(e).__name__}); set GPT2_TIKTOKEN_FILE "
                        f"to a local gpt2.tiktoken ranks file") from e


class Tokenizer:
    """encode(text) -> list of ids, decode(ids) -> text, plus name, vocab_size and eot (None if no such token).
    encode_ordinary, for prepare scripts, treats special tokens written in the text as plain text."""

    def __init__(self, name, itos=None, tokenizer_json=None, eot=None):
        self.name = name
        if name == "gpt2":
            self.enc = gpt2_encoding()
            self.vocab_size, self.eot = self.enc.n_vocab, self.enc.eot_token
        elif name == "char":
            self.itos = list(itos)
            self.stoi = {ch: i for i, ch in enumerate(self.itos)}
            self.vocab_size, self.eot = len(self.itos), None
        elif name == "hf":
            self.hf = _hf_tokenizer(tokenizer_json)
            self.vocab_size, self.eot = _hf_vocab_size(self.hf), eot
        else:
            raise UserError(f"unknown tokenizer {name!r} (known: char, gpt2, hf)")

    def encode(self, text):
        if self.name == "gpt2":
            # a prompt may hold <|endoftext|> on purpose (e.g. to start a fresh document), so allow it
            return self.enc.encode(text, allowed_special={"<|endoftext|>"})
        if self.name == "hf":
            # special tokens in the text are recognised, as for GPT-2; no BOS/EOS template is added, since
            # the training data has none either
            return self.hf.encode(text, add_special_tokens=False).ids
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in this dataset's vocabulary of "
                            f"{self.vocab_size} characters") from None

    def encode_ordinary(self, text):
        if self.name == "gpt2":
            return self.enc.encode_ordinary(text)
        if self.name == "hf":
            self.hf.encode_special_tokens = True  # "<|endoftext|>" in a document is text, not the separator
            try:
                return self.hf.encode(text, add_special_tokens=False).ids
            finally:
                self.hf.encode_special_tokens = False
        return self.encode(text)

    def decode(self, ids):
        ids = [int(i) for i in ids]  # numpy and torch integers -> plain ints
        if self.name == "gpt2":
            return self.enc.decode(ids)
        if self.name == "hf":
            return self.hf.decode(ids, skip_special_tokens=False)  # show <|endoftext|>, as GPT-2's does
        return "".join(self.itos[i] for i in ids)


@functools.lru_cache(maxsize=None)
def hf_tokenizer_file(path, eot=None):
    """A Tokenizer for a tokenizers JSON file, built once per process (for prepare scripts' workers)."""
    return Tokenizer("hf", tokenizer_json=Path(path).read_text(encoding="utf-8"), eot=eot)


def _hf_tokenizer(tokenizer_json, where="the dataset's tokenizer"):
    import tokenizers  # only datasets with a tokenizers file need it
    try:
        return tokenizers.Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # tokenizers raises plain Exceptions for malformed files
        reason = str(e).splitlines()[0][:200]
        raise UserError(f"{where} is not a Hugging Face tokenizers JSON file ({reason})") from None


def _hf_vocab_size(hf):
    # one past the largest id: added tokens may leave gaps, so the count of tokens could fall short of it
    return max(hf.get_vocab(with_added_tokens=True).values()) + 1


def get_tokenizer(meta):
    """The tokenizer for a dataset's meta dict (from gpt.data.read_meta); None means GPT-2 BPE, as in nanoGPT."""
    meta = meta or {}
    name = meta.get("tokenizer", "gpt2")
    if name not in ("char", "gpt2", "hf"):
        raise UserError(f"meta.json names unknown tokenizer {name!r} (known: char, gpt2, hf)")
    if name == "char" and not isinstance(meta.get("itos"), list):
        raise UserError("meta.json says tokenizer 'char' but has no 'itos' list; re-run the dataset's prepare.py")
    if name == "hf" and not isinstance(meta.get("tokenizer_json"), str):
        raise UserError("meta says tokenizer 'hf' but holds no tokenizer_json (read it with gpt.data.read_meta)")
    return Tokenizer(name, meta.get("itos"), meta.get("tokenizer_json"), meta.get("eot"))


def dtype_for_vocab(vocab_size):
    """The token files' storage type for a vocabulary: uint16 while every id fits (GPT-2's 50257 does)."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def char_meta(text):
    """meta.json for a character-level dataset: every distinct character of text, sorted, is one token."""
    chars = sorted(set(text))
    return {"tokenizer": "char", "vocab_size": len(chars), "dtype": dtype_for_vocab(len(chars)), "itos": chars}


# what an existing tokenizer may call its end-of-text token, the separator between documents
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def train_bpe(texts, vocab_size, progress=None):
    """A byte-level BPE (GPT-2's scheme: every text round-trips) with <|endoftext|> its one special token,
    trained on an iterable of texts; progress bars when `progress` (None: when stderr is a terminal)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    if vocab_size <= 257:
        raise UserError(f"--vocab_size must be above 257 (256 bytes and <|endoftext|>), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  show_progress=sys.stderr.isatty() if progress is None else progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def dataset_tokenizer(choice, out_dir, texts=None, vocab_size=None):
    """A prepare script's --tokenizer (gpt2, train: a BPE trained on texts(), or a tokenizers JSON file) and
    the dataset's meta.json; the last two save the tokenizer as out_dir/tokenizer.json."""
    if choice == "gpt2":
        tok = Tokenizer("gpt2")
        return tok, {"tokenizer": "gpt2", "vocab_size": tok.vocab_size, "dtype": "uint16", "eot": tok.eot}
    if choice == "train":
        print(f"training a byte-level BPE tokenizer of {vocab_size:,} tokens")
        tokenizer_json = train_bpe(texts(), vocab_size).to_str()
    else:
        try:
            tokenizer_json = Path(choice).read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"--tokenizer {choice}: not gpt2, train, or a readable tokenizers JSON file "
                            f"({e.strerror or e})")
    meta = hf_meta(tokenizer_json, choice if choice != "train" else "the trained tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    with atomic_write(os.path.join(out_dir, meta["tokenizer_file"])) as f:
        f.write(tokenizer_json.encode("utf-8"))
    print(f"tokenizer: {meta['vocab_size']:,} tokens, end-of-text id {meta['eot']}, stored as {meta['dtype']}")
    return Tokenizer("hf", tokenizer_json=tokenizer_json, eot=meta["eot"]), meta


def hf_meta(tokenizer_json, where="the tokenizer"):
    """meta.json for a dataset with this tokenizers file (saved beside it as tokenizer.json)."""
    hf = _hf_tokenizer(tokenizer_json, where)
    eot = next((hf.token_to_id(t) for t in EOT_NAMES if hf.token_to_id(t) is not None), None)
    vocab_size = _hf_vocab_size(hf)
    return {"tokenizer": "hf", "tokenizer_file": "tokenizer.json", "vocab_size": vocab_size,
            "dtype": dtype_for_vocab(vocab_size), "eot": eot}


def folder_meta(init_from):
    """The meta of a transformers folder's tokenizer.json; None (GPT-2 BPE) for a hub name or a GPT-2 folder without
    one. Any other folder without one is a UserError: its ids mean nothing known."""
    if not os.path.isdir(init_from):
        return None  # a hub name: gpt2, gpt2-medium, ...
    path = os.path.join(init_from, "tokenizer.json")
    if not os.path.isfile(path):
        config = {}
        with suppress(OSError, ValueError):
            config = json.loads(Path(init_from, "config.json").read_text(encoding="utf-8"))
        kind, vocab = config.get("model_type", "?"), config.get("vocab_size", "?")
        if kind == "gpt2" and vocab in (GPT2_EOT + 1, 50304):
            return None
        also = (" (its tokenizer.model, a sentencepiece file, is not read: AutoTokenizer.from_pretrained(folder)"
                ".save_pretrained(folder) writes tokenizer.json)") if os.path.isfile(
            os.path.join(init_from, "tokenizer.model")) else ""
        raise UserError(f"{path} is missing, so the tokenizer of this {kind} model ({vocab} tokens, not GPT-2's "
                        f"BPE) cannot be known{also}")
    tokenizer_json = Path(path).read_text(encoding="utf-8")
    return exported_char_meta(tokenizer_json) or {**hf_meta(tokenizer_json, path), "tokenizer_json": tokenizer_json}


def exported_char_meta(tokenizer_json):
    """The char meta of a folder export.py wrote for a character model (gpt/hf/tokenizer.py's hf_tokenizer),
    so that the folder fine-tunes on its character dataset; None for any other tokenizer."""
    try:
        spec = json.loads(tokenizer_json)
    except ValueError:
        return None  # hf_meta names the broken file
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "WordLevel" or pre.get("type") != "Split":
        return None
    special = {t.get("content") for t in spec.get("added_tokens") or []}
    chars = sorted((i, t) for t, i in model.get("vocab", {}).items() if t not in special)
    if [i for i, _ in chars] != list(range(len(chars))) or any(len(t) != 1 for _, t in chars):
        return None
    itos = [t for _, t in chars]
    return {"tokenizer": "char", "vocab_size": len(itos), "dtype": dtype_for_vocab(len(itos)), "itos": itos}


PROBE = "Hello, world! The 2 quick brown foxes jumped over 13 lazy dogs.\n  Indented: naïve café, 東京."


def describe(meta):
    name = (meta or {}).get("tokenizer", "gpt2")
    if name == "char":
        return f"characters, {meta['vocab_size']} of them"
    if name == "hf":
        return f"a tokenizers file of {meta['vocab_size']:,} tokens"
    return "GPT-2 BPE"


def same_tokenizer(a, b):
    """Whether two metas (None: GPT-2 BPE) tokenize alike: True, False, or None when that cannot be told here."""
    ka, kb = (a or {}).get("tokenizer", "gpt2"), (b or {}).get("tokenizer", "gpt2")
    if "char" in (ka, kb):
        return ka == kb and list(a.get("itos") or []) == list(b.get("itos") or [])
    if ka == kb == "gpt2" or (ka == kb == "hf" and a.get("tokenizer_json") == b.get("tokenizer_json")):
        return True
    with suppress(Exception):
        return get_tokenizer(a).encode_ordinary(PROBE) == get_tokenizer(b).encode_ordinary(PROBE)
    return None


def check_data_for_model(data_meta, init_from, resumed, data_label):
    """One line when a dataset (its meta.json; None: GPT-2 BPE) is tokenized otherwise than the model it
    trains (docs/checkpoints.md#tokenizers). A new model (init_from=scratch) takes the data's."""
    if init_from == "scratch" or (resumed is not None and "dataset_meta" not in resumed):
        return
    try:
        model_meta = resumed["dataset_meta"] if resumed is not None else folder_meta(init_from)
    except UserError:
        return  # a folder whose tokenizer cannot be known: nothing to compare (the vocabulary check remains)
    model_from = resumed["path"] if resumed is not None else init_from
    if same_tokenizer(data_meta, model_meta) is not False:
        return
    kind = (model_meta or {}).get("tokenizer", "gpt2")
    if kind == "gpt2":
        how = ("`python data/shakespeare/prepare.py` and --dataset=shakespeare (openwebtext and fineweb are "
               "GPT-2 BPE too)")
    elif kind == "hf":
        tok = os.path.join(init_from, "tokenizer.json") if os.path.isdir(init_from) else "<its tokenizer.json>"
        how = f"`python data/shakespeare/prepare.py --tokenizer={tok} --out_dir=<a new folder>`"
    else:
        how = "the character-level dataset it was trained on (`python data/shakespeare_char/prepare.py`)"
    raise UserError(f"{data_label} is tokenized with {describe(data_meta)}, but the model ({model_from}) with "
                    f"{describe(model_meta)}: the ids would mean other tokens; prepare the data for this model: {how}")
