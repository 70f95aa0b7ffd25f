"""
Tokenizers: GPT-2 BPE (tiktoken, offline from a ranks file), characters, and Hugging Face `tokenizers` JSON
files: prepare trains one on the text (or takes an existing file), the ids round-trip, the storage dtype
follows the vocabulary, and train.py, sample.py and HellaSwag use the tokenizer from the metadata, and then
from the checkpoint alone.
"""
import json
import os
import random
import shutil

import numpy as np
import pytest
import tiktoken
import torch
from conftest import flags, run, tiny

from gpt.checkpoint import load_model
from gpt.data import open_tokens, read_meta
from gpt.data.tokenizer import Tokenizer, char_meta, folder_meta, get_tokenizer, gpt2_encoding
from gpt.runtime.errors import UserError
from gpt.training import hellaswag_eval as hellaswag

VOCAB = 512


def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def splits(data_dir):
    meta = read_meta(data_dir)
    return meta, [np.asarray(open_tokens(os.path.join(data_dir, f"{s}.bin"), meta["dtype"])) for s in ("train", "val")]


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


# Hugging Face tokenizers JSON files


@pytest.fixture(scope="module")
def bpe_data(corpus_path, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("shakespeare_bpe") / "data"
    run(os.path.join("data", "shakespeare", "prepare.py"), "--input", corpus_path, "--out_dir", data_dir,
        "--tokenizer=train", f"--vocab_size={VOCAB}")
    return data_dir


@pytest.fixture(scope="module")
def trained(bpe_data, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bpe_run") / "out"
    run("train.py", f"--data_dir={bpe_data}", "--dataset=shakespeare_bpe", f"--out_dir={out_dir}", "--family=llama",
        *flags(**tiny(n_layer=1, batch_size=8, max_iters=30, eval_interval=30, warmup_iters=5, lr_decay_iters=30,
                      log_interval=10)))
    return out_dir


@pytest.mark.needs("tokenizers")
def test_trained_tokenizer_round_trips_the_text(bpe_data, corpus_path):
    assert sorted(os.listdir(bpe_data)) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    with open(bpe_data / "meta.json") as f:
        assert json.load(f) == {"tokenizer": "hf", "tokenizer_file": "tokenizer.json", "vocab_size": VOCAB,
                                "dtype": "uint16", "eot": 0}
    meta, (train, val) = splits(bpe_data)
    tok = get_tokenizer(meta)
    assert (tok.name, tok.vocab_size, tok.eot) == ("hf", VOCAB, 0)
    text = read_text(corpus_path)
    assert tok.decode(train) + tok.decode(val) == text
    assert len(train) + len(val) < 0.6 * len(text)  # real merges, not bytes
    assert max(train.max(), val.max()) < VOCAB
    odd = "héllo wörld — 日本語 🙂 \t\r\n  'll 123"
    assert tok.decode(tok.encode(odd)) == odd  # byte-level: any text, even unseen characters
    assert tok.encode("<|endoftext|>") == [0]  # a prompt may name the separator
    assert 0 not in tok.encode_ordinary("a <|endoftext|> in a document is text")


@pytest.mark.needs("tokenizers")
def test_an_existing_tokenizer_file_gives_the_same_ids(bpe_data, corpus_path, tmp_path):
    out = tmp_path / "again"
    run(os.path.join("data", "shakespeare", "prepare.py"), "--input", corpus_path, "--out_dir", out,
        f"--tokenizer={bpe_data / 'tokenizer.json'}")
    assert read_text(out / "tokenizer.json") == read_text(bpe_data / "tokenizer.json")
    (_, (a_train, a_val)), (_, (b_train, b_val)) = splits(bpe_data), splits(out)
    assert np.array_equal(a_train, b_train) and np.array_equal(a_val, b_val)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for choice in (bad, tmp_path / "missing.json"):
        r = run(os.path.join("data", "shakespeare", "prepare.py"), "--input", corpus_path, "--out_dir",
                tmp_path / "x", f"--tokenizer={choice}", check=False)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and str(choice) in r.stderr, r.stderr


@pytest.mark.needs("tokenizers")
def test_a_vocabulary_beyond_uint16_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = "to be or not that is the question whether tis nobler in mind".split()
    filler = {f"w{i}": i for i in range(70000)}
    vocab = {**filler, "[UNK]": 70000, **{w: 70001 + i for i, w in enumerate(words)}}  # real words past 65535
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    text = " ".join(words * 5)
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    run(os.path.join("data", "shakespeare", "prepare.py"), "--input", tmp_path / "input.txt", "--out_dir", out,
        f"--tokenizer={tmp_path / 'big.json'}")
    meta, (train, val) = splits(out)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70001 + len(words) and meta["eot"] is None
    assert train.dtype == np.uint32 and train.max() > 65535
    cut = int(len(text) * 0.9)  # the prepare script's split
    assert train.tolist() == tok.encode(text[:cut]).ids and val.tolist() == tok.encode(text[cut:]).ids


@pytest.mark.needs("tokenizers")
def test_train_and_sample_use_the_tokenizer_from_the_checkpoint(bpe_data, trained, tmp_path):
    ckpt = torch.load(trained / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["model_args"]["vocab_size"] == VOCAB  # 512 is already a multiple of 64
    assert ckpt["dataset_meta"]["tokenizer_json"] == read_text(bpe_data / "tokenizer.json")
    # sample.py needs nothing but the checkpoint: the dataset folder is gone
    moved = tmp_path / "elsewhere"
    shutil.copytree(trained, moved)
    r = run("sample.py", f"--out_dir={moved}", "--device=cpu", "--num_samples=1", "--max_new_tokens=20",
            "--start=ROMEO:", "--temperature=0")
    assert f"tokenizer: hf ({VOCAB} tokens)" in r.stdout
    text = r.stdout.split(f"tokenizer: hf ({VOCAB} tokens)\n", 1)[1].split("\n---------------\n")[0]
    assert text.startswith("ROMEO:") and len(text) > len("ROMEO:")
    model, meta = load_model("resume", str(moved))
    tok = get_tokenizer(meta)
    ids = tok.encode(text)
    assert tok.decode(ids) == text


@pytest.mark.needs("tokenizers")
def test_hellaswag_scores_with_the_datasets_tokenizer(trained):
    model, meta = load_model("resume", str(trained))
    tok = get_tokenizer(meta)
    rng = random.Random(0)
    endings = ["sings.", "walks to the market.", "sleeps.", "eats an apple slowly."]
    examples = [{"ctx": "A man is in a kitchen. He", "endings": endings, "label": rng.randrange(4)} for _ in range(5)]
    result = hellaswag.evaluate(model, examples, tok, "cpu", None)
    assert result["n"] == 5 and 0 <= result["acc_norm"] <= 1


@pytest.mark.needs("transformers")
def test_a_transformers_folder_brings_its_tokenizer(bpe_data, tmp_path):
    import transformers
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="tokenizer.json is missing"):  # its ids are not GPT-2 BPE's
        folder_meta(str(tmp_path))
    shutil.copy(bpe_data / "tokenizer.json", tmp_path)
    model, meta = load_model(str(tmp_path), "unused")  # what sample.py and hellaswag.py do
    tok = get_tokenizer(meta or folder_meta(str(tmp_path)))
    assert model.config.family == "llama" and (tok.name, tok.vocab_size, tok.eot) == ("hf", VOCAB, 0)
    out = model.eval().generate(torch.tensor([tok.encode("ROMEO:")]), 5, temperature=0)
    assert tok.decode(out[0].tolist()).startswith("ROMEO:")


@pytest.mark.needs("tokenizers")
def test_get_tokenizer_needs_the_json():
    with pytest.raises(UserError, match="tokenizer_json"):
        get_tokenizer({"tokenizer": "hf", "vocab_size": 10})
    with pytest.raises(UserError, match="not a Hugging Face tokenizers JSON"):
        get_tokenizer({"tokenizer": "hf", "vocab_size": 10, "tokenizer_json": "{}"})


def test_read_meta_names_a_missing_tokenizer_file(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"tokenizer": "hf", "tokenizer_file": "tokenizer.json",
                                                    "vocab_size": 10, "dtype": "uint16", "eot": None}))
    with pytest.raises(UserError, match="tokenizer.json"):
        read_meta(tmp_path)


@pytest.mark.needs("datasets", "tokenizers")
def test_openwebtext_with_a_trained_tokenizer(tmp_path):
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "héllo", "日本", "🙂", "\n", "  ", "'s", "42", "<|endoftext|>"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(50)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    out = tmp_path / "out"
    run(os.path.join("data", "openwebtext", "prepare.py"), "--local", src, "--num_proc", "2", "--out_dir", out,
        "--tokenizer=train", "--vocab_size=300", env={"HF_DATASETS_CACHE": str(tmp_path / "c")})
    meta, (train, val) = splits(out)
    assert (meta["tokenizer"], meta["eot"], meta["vocab_size"]) == ("hf", 0, 300)
    tok = get_tokenizer(meta)
    got = []
    for split in (train, val):
        ids = split.tolist()
        assert ids[-1] == 0
        cuts = [-1] + [i for i, t in enumerate(ids) if t == 0]  # each document ends with <|endoftext|>
        got += [tok.decode(ids[a + 1:b]) for a, b in zip(cuts, cuts[1:])]
    assert sorted(got) == sorted(docs)  # a literal "<|endoftext|>" in a document stays text
