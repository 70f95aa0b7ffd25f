"""
Tokenizers: GPT-2 BPE (tiktoken, online or from a local ranks file) and characters.

    enc = gpt2_encoding()              # a tiktoken.Encoding, for prepare scripts that want encode_ordinary
    tok = get_tokenizer(read_meta(d))  # what sample.py and train.py use: .encode, .decode, .vocab_size, .eot
"""
import base64
import functools
import os

import tiktoken

from datafiles import dtype_for_vocab
from errors import UserError

GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = 50256


def _load_ranks(path):
    # the same parsing as tiktoken.load.load_tiktoken_bpe, minus its cache: that one copies the file into
    # /tmp keyed by path, so a file replaced at the same path would silently keep giving the old ranks
    try:
        with open(path, "rb") as f:
            contents = f.read()
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
    path = os.environ.get("GPT2_TIKTOKEN_FILE")
    if path:
        return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=_load_ranks(path),
                                 special_tokens={"<|endoftext|>": GPT2_EOT})
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests/urllib/blobfile errors differ; all mean the files could not be fetched
        raise UserError(f"GPT-2 BPE files could not be downloaded ({type(e).__name__}); set GPT2_TIKTOKEN_FILE "
                        f"to a local gpt2.tiktoken ranks file") from e


class Tokenizer:
    """encode(text) -> list of ids, decode(ids) -> text, plus name, vocab_size and eot (None if no such token)."""

    def __init__(self, name, itos=None):
        self.name = name
        if name == "gpt2":
            self.enc = gpt2_encoding()
            self.vocab_size, self.eot = self.enc.n_vocab, self.enc.eot_token
        elif name == "char":
            self.itos = list(itos)
            self.stoi = {ch: i for i, ch in enumerate(self.itos)}
            self.vocab_size, self.eot = len(self.itos), None
        else:
            raise UserError(f"unknown tokenizer {name!r} (known: char, gpt2)")

    def encode(self, text):
        if self.name == "gpt2":
            # a prompt may hold <|endoftext|> on purpose (e.g. to start a fresh document), so allow it
            return self.enc.encode(text, allowed_special={"<|endoftext|>"})
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in this dataset's vocabulary of "
                            f"{self.vocab_size} characters") from None

    def decode(self, ids):
        ids = [int(i) for i in ids]  # numpy and torch integers -> plain ints
        if self.name == "gpt2":
            return self.enc.decode(ids)
        return "".join(self.itos[i] for i in ids)


def get_tokenizer(meta):
    """The tokenizer for a dataset's meta dict (from datafiles.read_meta); None means GPT-2 BPE, as in nanoGPT."""
    if meta is None:
        return Tokenizer("gpt2")
    name = meta.get("tokenizer", "gpt2")
    if name == "char":
        if not isinstance(meta.get("itos"), list):
            raise UserError("meta.json says tokenizer 'char' but has no 'itos' list; re-run the dataset's prepare.py")
        return Tokenizer("char", meta["itos"])
    if name == "gpt2":
        return Tokenizer("gpt2")
    raise UserError(f"meta.json names unknown tokenizer {name!r} (known: char, gpt2)")


def char_meta(text):
    """meta.json for a character-level dataset: every distinct character of text, sorted, is one token."""
    chars = sorted(set(text))
    return {"tokenizer": "char", "vocab_size": len(chars), "dtype": dtype_for_vocab(len(chars)), "itos": chars}
