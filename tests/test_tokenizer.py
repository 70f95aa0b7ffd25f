import numpy as np
import pytest
import tiktoken

from gpt.errors import UserError
from gpt.tokenizer import Tokenizer, char_meta, get_tokenizer, gpt2_encoding


@pytest.fixture
def offline_gpt2(gpt2_ranks_path, monkeypatch):
    monkeypatch.setenv("GPT2_TIKTOKEN_FILE", gpt2_ranks_path)
    gpt2_encoding.cache_clear()
    yield gpt2_ranks_path
    gpt2_encoding.cache_clear()


def test_gpt2_known_ids(offline_gpt2):
    enc = gpt2_encoding()
    assert enc.name == "gpt2" and enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    tok = get_tokenizer(None)  # no meta: GPT-2 BPE, as in nanoGPT
    assert (tok.name, tok.vocab_size, tok.eot) == ("gpt2", 50257, 50256)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("<|endoftext|>") == [50256]
    assert tok.encode("Hello<|endoftext|> world") == [15496, 50256, 995]
    assert gpt2_encoding() is gpt2_encoding()  # cached


def test_gpt2_round_trip(offline_gpt2):
    tok = get_tokenizer({"tokenizer": "gpt2", "vocab_size": 50257})
    text = "First Citizen:\nBefore we proceed, hear me.\n\n  héllo wörld — 日本語 🙂 \t'll 123"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(np.array(ids, dtype=np.uint16)) == text  # ids straight from a .bin file


def test_gpt2_no_file_no_network(monkeypatch):
    def no_network(name):
        raise ConnectionError("no network")
    monkeypatch.delenv("GPT2_TIKTOKEN_FILE", raising=False)
    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    gpt2_encoding.cache_clear()
    try:
        with pytest.raises(UserError, match="GPT2_TIKTOKEN_FILE") as e:
            gpt2_encoding()
        assert "download" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(UserError, match="GPT2_TIKTOKEN_FILE"):
            get_tokenizer(None)
    finally:
        gpt2_encoding.cache_clear()


def test_gpt2_bad_file(tmp_path, monkeypatch):
    missing = tmp_path / "nope.tiktoken"
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("this is not base64 at all\n")
    for path in (missing, bad):
        monkeypatch.setenv("GPT2_TIKTOKEN_FILE", str(path))
        gpt2_encoding.cache_clear()
        try:
            with pytest.raises(UserError, match=str(path)):
                gpt2_encoding()
        finally:
            gpt2_encoding.cache_clear()


def test_char_round_trip_and_unknown():
    text = "hello, wörld!\n"
    meta = char_meta(text)
    assert meta == {"tokenizer": "char", "vocab_size": 12, "dtype": "uint16", "itos": sorted(set(text))}
    tok = get_tokenizer(meta)
    assert (tok.name, tok.vocab_size, tok.eot) == ("char", 12, None)
    ids = tok.encode(text)
    assert ids == [meta["itos"].index(c) for c in text]
    assert tok.decode(ids) == text
    assert tok.decode(np.array(ids, dtype=np.uint16)) == text
    with pytest.raises(UserError, match="'z'"):
        tok.encode("hello z")


def test_unknown_tokenizer():
    with pytest.raises(UserError, match="sentencepiece"):
        get_tokenizer({"tokenizer": "sentencepiece", "vocab_size": 100})
    with pytest.raises(UserError, match="itos"):
        get_tokenizer({"tokenizer": "char", "vocab_size": 3})
    with pytest.raises(UserError):
        Tokenizer("bogus")
