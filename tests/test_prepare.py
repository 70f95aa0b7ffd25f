"""
data/<dataset>/prepare.py: shakespeare_char, shakespeare (GPT-2 BPE) and openwebtext from local files, and
fetching tinyshakespeare.
"""
import io
import json
import os
import random
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import SHARED, run

from gpt.data import TINY_SHAKESPEARE_URL, open_tokens, read_meta, tiny_shakespeare
from gpt.errors import UserError
from gpt.tokenizer import get_tokenizer

# the texts prepared: the generated corpus always; tinyshakespeare too where the shared data folder has it,
# with the split sizes nanoGPT's readme gives (characters, GPT-2 tokens)
TINY_SHAKESPEARE = os.path.join(SHARED, "tinyshakespeare.txt")
TEXTS = ["generated"] + (["tinyshakespeare"] if os.path.exists(TINY_SHAKESPEARE) else [])
NANOGPT_SPLITS = {"char": (1_003_854, 111_540), "gpt2": (301_966, 36_059)}


def prepare(dataset, *args, env=None):
    return run(os.path.join("data", dataset, "prepare.py"), *args, env=env, check=False)


@pytest.fixture(params=TEXTS)
def text_path(request, corpus_path):
    return corpus_path if request.param == "generated" else TINY_SHAKESPEARE


def expected_splits(text_path, tok):
    """(train, val) lengths in tokens: nanoGPT's for tinyshakespeare; the first 90% of the characters else."""
    if text_path == TINY_SHAKESPEARE:
        return NANOGPT_SPLITS[tok.name]
    text = read_text(text_path)
    cut = int(len(text) * 0.9)
    if tok.name == "char":
        return cut, len(text) - cut
    return len(tok.enc.encode_ordinary(text[:cut])), len(tok.enc.encode_ordinary(text[cut:]))


def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def decode_splits(out_dir):
    meta = read_meta(out_dir)
    tok = get_tokenizer(meta)
    return tok, [open_tokens(os.path.join(out_dir, f"{s}.bin"), meta["dtype"]) for s in ("train", "val")]


def test_shakespeare_char(text_path, tmp_path):
    r = prepare("shakespeare_char", "--input", text_path, "--out_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "vocab size: 65" in r.stdout
    meta = read_meta(tmp_path)
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == 65 and len(meta["itos"]) == 65
    tok, (train, val) = decode_splits(tmp_path)
    assert (len(train), len(val)) == expected_splits(text_path, tok)
    assert tok.decode(train) + tok.decode(val) == read_text(text_path)
    assert sorted(os.listdir(tmp_path)) == ["meta.json", "train.bin", "val.bin"]


def test_shakespeare_bpe(text_path, gpt2_ranks_path, tmp_path):
    r = prepare("shakespeare", "--input", text_path, "--out_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "meta.json").read_text()) == {
        "tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "eot": 50256}
    tok, (train, val) = decode_splits(tmp_path)
    assert (len(train), len(val)) == expected_splits(text_path, tok)
    assert tok.decode(train) + tok.decode(val) == read_text(text_path)


def test_openwebtext_local(gpt2_ranks_path, tmp_path):
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "héllo", "日本", "🙂", "\n", "  ", "'s", "42", "<|endoftext|>"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(50)]
    docs[0] = ""  # an empty document still gets its end-of-text token
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    out = tmp_path / "out"
    r = prepare("openwebtext", "--local", src, "--num_proc", 2, "--out_dir", out,
                env={"HF_DATASETS_CACHE": str(tmp_path / "hf_cache")})
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]  # no .tmp left behind
    assert read_meta(out)["tokenizer"] == "gpt2"
    tok, (train, val) = decode_splits(out)
    assert len(val) > 0 and len(train) > 0
    # the split is shuffled, so compare documents as multisets: each is its encode_ordinary ids then 50256
    # (a literal "<|endoftext|>" in a document is ordinary text, so it never produces 50256 itself)
    got = []
    for split in (train, val):
        ids = np.asarray(split).tolist()
        assert ids[-1] == 50256
        cuts = [-1] + [i for i, t in enumerate(ids) if t == 50256]
        got += [ids[a + 1:b] for a, b in zip(cuts, cuts[1:])]
    want = [tok.enc.encode_ordinary(d) for d in docs]
    assert sorted(got) == sorted(want)
    assert sorted(tok.decode(d) for d in got) == sorted(docs)


def test_missing_input_is_one_line(tmp_path):
    missing = tmp_path / "no_such_file.txt"
    for dataset, flag in [("shakespeare_char", "--input"), ("shakespeare", "--input"),
                          ("openwebtext", "--local"), ("openwebtext", "--input")]:
        r = prepare(dataset, flag, missing, "--out_dir", tmp_path / "out")
        assert r.returncode != 0, dataset
        assert "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(missing) in lines[0], r.stderr
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_tiny_shakespeare_download(monkeypatch, tmp_path):
    # the download branch of both Shakespeare scripts, with urlopen standing in for the network
    urls = []

    def fetch(url, timeout):
        urls.append(url)
        return io.BytesIO("First Citizen:\r\nSpeak.\n".encode())
    monkeypatch.setattr(urllib.request, "urlopen", fetch)
    assert tiny_shakespeare(None, tmp_path) == ("First Citizen:\r\nSpeak.\n", str(tmp_path / "input.txt"))
    assert urls == [TINY_SHAKESPEARE_URL] and os.listdir(tmp_path) == ["input.txt"]  # no temp file left
    assert tiny_shakespeare(None, tmp_path)[0] == "First Citizen:\r\nSpeak.\n" and len(urls) == 1  # kept


def test_tiny_shakespeare_offline(monkeypatch, tmp_path):
    def offline(url, timeout):
        raise urllib.error.URLError("no network in tests")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(UserError, match="could not download .*pass --input"):
        tiny_shakespeare(None, tmp_path)
    assert os.listdir(tmp_path) == []  # nothing that a later run could take for the text
