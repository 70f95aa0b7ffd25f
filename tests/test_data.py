"""
Token files: the llm.c shard format, listing shards, and data/fineweb/prepare.py writing them.
"""
import json
import os
import random
import shutil

import numpy as np
import pytest
from conftest import run as run_script

from gpt.data import list_shards, open_shard, read_meta
from gpt.data.sources import write_shard
from gpt.data.tokenizer import gpt2_encoding
from gpt.runtime.errors import UserError

SHARD = 2000


def run(*args, env=None):
    return run_script(*args, env=env, check=False)


def prepare(src, out, cache, *extra):
    return run(os.path.join("data", "fineweb", "prepare.py"), "--local", src, "--out_dir", out,
               "--shard_size", SHARD, "--num_proc", 2, *extra, env={"HF_DATASETS_CACHE": str(cache)})


def snapshot(folder):
    return {name: (os.stat(folder / name).st_mtime_ns, (folder / name).read_bytes()) for name in os.listdir(folder)}


def shard_names(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith(".bin"))


@pytest.fixture(scope="module")
def docs():
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "héllo", "日本", "🙂", "\n", "  ", "'s", "42", "<|endoftext|>"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 400))) for _ in range(40)]
    docs[3] = ""  # an empty document is just its end-of-text token
    docs[20] = " ".join(rng.choice(words) for _ in range(3000))  # longer than two shards
    return docs


@pytest.fixture(scope="module")
def prepared(docs, gpt2_ranks_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fineweb")
    src = tmp / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    out = tmp / "out"
    r = prepare(src, out, tmp / "hf_cache")
    assert r.returncode == 0, r.stderr
    return src, out, tmp / "hf_cache"


def expected_tokens(docs):
    enc = gpt2_encoding()
    # each document PRECEDED by <|endoftext|>; a literal "<|endoftext|>" in the text is ordinary text
    return [[50256] + enc.encode_ordinary(d) for d in docs]


@pytest.mark.needs("datasets")
def test_shards_hold_the_documents_in_order(docs, prepared):
    _, out, _ = prepared
    want = np.concatenate([np.array(t) for t in expected_tokens(docs)])
    n = -(-len(want) // SHARD)
    assert n >= 5
    names = ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin" for i in range(1, n)]
    assert sorted(os.listdir(out)) == sorted(names + ["meta.json"])  # no .tmp files left behind
    assert [os.path.basename(p) for p in list_shards(str(out), "val") + list_shards(str(out), "train")] == names
    shards = [open_shard(out / name) for name in names]
    assert all(s.dtype == np.uint16 for s in shards)
    assert [len(s) for s in shards] == [SHARD] * (n - 1) + [len(want) - SHARD * (n - 1)]
    assert np.array_equal(shards[0], want[:SHARD])  # the val shard is the first shard_size tokens
    assert np.array_equal(np.concatenate(shards), want)
    assert json.loads((out / "meta.json").read_text()) == {
        "tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "eot": 50256, "format": "shards"}
    assert read_meta(str(out))["format"] == "shards"


@pytest.mark.needs("datasets")
def test_streaming_writes_the_same_shards(prepared, tmp_path):
    """--streaming reads the documents as they come (an IterableDataset) and writes the same bytes."""
    src, out, cache = prepared
    streamed = tmp_path / "streamed"
    r = prepare(src, streamed, cache, "--streaming")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(streamed)) == sorted(os.listdir(out))
    assert all((streamed / name).read_bytes() == (out / name).read_bytes() for name in os.listdir(out))


@pytest.mark.needs("datasets")
def test_document_across_a_shard_boundary_is_intact(docs, prepared):
    _, out, _ = prepared
    shards = [open_shard(p) for p in list_shards(str(out), "val") + list_shards(str(out), "train")]
    start, straddlers = 0, 0
    for ids in expected_tokens(docs):
        end = start + len(ids)
        first, last = start // SHARD, (end - 1) // SHARD
        if first != last:  # starts in one shard, ends in a later one
            straddlers += 1
            pieces = [shards[first][start - first * SHARD:]] + [shards[i] for i in range(first + 1, last)]
            pieces.append(shards[last][:end - last * SHARD])
            assert np.concatenate(pieces).tolist() == ids
            assert all(len(p) for p in pieces)
        start = end
    assert straddlers >= 3


@pytest.mark.needs("datasets")
def test_rerun_rewrites_nothing_and_repairs_a_truncated_shard(prepared):
    src, out, cache = prepared
    before = snapshot(out)
    r = prepare(src, out, cache)
    assert r.returncode == 0, r.stderr
    assert "written" not in r.stdout and "unchanged" in r.stdout
    assert snapshot(out) == before  # same bytes, same mtimes
    # a truncated shard (an interrupted copy, say) is rewritten; the complete ones are left alone
    damaged = out / "fineweb_train_000002.bin"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    r = prepare(src, out, cache)
    assert r.returncode == 0, r.stderr
    after = snapshot(out)
    assert {name: data for name, (_, data) in after.items()} == {name: data for name, (_, data) in before.items()}
    assert [name for name in after if after[name][0] != before[name][0]] == [damaged.name]


@pytest.mark.needs("datasets")
def test_stale_shards_of_an_earlier_run_are_removed(docs, prepared, tmp_path):
    src, out, cache = prepared
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    r = prepare(src, copy, cache, "--shard_size", 5000)  # the later flag wins: fewer, larger shards
    assert r.returncode == 0, r.stderr
    want = sum(expected_tokens(docs), [])
    names = shard_names(copy)
    assert len(names) == -(-len(want) // 5000) < len(shard_names(out)) and "removed" in r.stdout
    shards = [open_shard(p) for p in list_shards(str(copy), "val") + list_shards(str(copy), "train")]
    assert np.concatenate(shards).tolist() == want


@pytest.mark.needs("datasets")
def test_bad_shards_are_rejected_in_one_line(prepared, tmp_path):
    _, out, _ = prepared
    truncated = tmp_path / "fineweb_train_000001.bin"
    truncated.write_bytes((out / truncated.name).read_bytes()[:-3])
    with pytest.raises(UserError, match=f"{truncated}.* truncated: header says {SHARD} tokens, file holds {SHARD - 2}"):
        open_shard(truncated)
    foreign = tmp_path / "foreign_train_000001.bin"
    foreign.write_bytes(np.random.default_rng(0).bytes(5000))
    with pytest.raises(UserError, match=f"{foreign} is not a token shard: bad magic"):
        open_shard(foreign)
    script = ("import sys; from gpt import data; from gpt.runtime import errors; errors.install(); "
              "data.open_shard(sys.argv[1])")
    for path, words in [(truncated, "truncated"), (foreign, "not a token shard")]:
        r = run("-c", script, path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], r.stderr


@pytest.mark.needs("datasets")
def test_user_mistakes_are_one_line(gpt2_ranks_path, tmp_path):
    cases = [("--local", tmp_path / "no_such_file.jsonl"), ("--shard_size", 0), ("--num_proc", 0)]
    for flag, value in cases:
        r = run(os.path.join("data", "fineweb", "prepare.py"), flag, value, "--out_dir", tmp_path / "out")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and flag in lines[0], r.stderr
    # the hub cannot be reached here (HF_HUB_OFFLINE=1): the message points at --local
    r = run(os.path.join("data", "fineweb", "prepare.py"), "--out_dir", tmp_path / "out",
            env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf_cache")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "fineweb-edu" in lines[0] and "--local" in lines[0], r.stderr
    # a dataset too small for a train shard
    src = tmp_path / "tiny.txt"
    src.write_text("just a few words", encoding="utf-8")
    r = prepare(src, tmp_path / "out", tmp_path / "hf_cache")
    assert r.returncode == 2 and "lower --shard_size" in r.stderr.strip().splitlines()[-1], r.stderr


def test_shard_format_is_llmc(tmp_path):
    path = tmp_path / "x_train_000001.bin"
    write_shard(path, [5, 6, 65535])
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:3]) == [20240520, 1, 3] and not header[3:].any()
    assert np.frombuffer(raw[1024:], dtype="<u2").tolist() == [5, 6, 65535]
    assert open_shard(path).tolist() == [5, 6, 65535]
    write_shard(path, [70000], "uint32")
    assert np.frombuffer(path.read_bytes()[:12], dtype="<i4").tolist() == [20240520, 2, 1]
    assert open_shard(path).dtype == np.uint32 and open_shard(path).tolist() == [70000]
    with pytest.raises(ValueError, match="does not fit uint16"):
        write_shard(path, [65536])
    assert open_shard(path).tolist() == [70000]  # the failed write left the old file alone
    write_shard(path, [])
    assert len(open_shard(path)) == 0
    assert sorted(os.listdir(tmp_path)) == ["x_train_000001.bin"]  # no temporary files left


def test_shard_errors(tmp_path):
    path = tmp_path / "s_train_000001.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(UserError, match=r"s_train_000001.bin is truncated: header says 100 tokens, file holds 95"):
        open_shard(path)
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes() + b"xx")
    with pytest.raises(UserError, match="corrupt"):
        open_shard(path)
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 7, 0]
    path.write_bytes(header.tobytes())
    with pytest.raises(UserError, match="unknown shard version 7"):
        open_shard(path)
    path.write_bytes(b"hello")
    with pytest.raises(UserError, match="not a token shard"):
        open_shard(path)


def test_list_shards(tmp_path):
    for name in ["f_train_000002.bin", "f_train_000001.bin", "f_val_000000.bin", "f_train_000003.bin.x.tmp",
                 "train.bin", "meta.json"]:
        (tmp_path / name).write_bytes(b"")
    assert [os.path.basename(p) for p in list_shards(str(tmp_path), "train")] == ["f_train_000001.bin",
                                                                                  "f_train_000002.bin"]
    assert [os.path.basename(p) for p in list_shards(str(tmp_path), "val")] == ["f_val_000000.bin"]
    assert list_shards(str(tmp_path / "missing"), "train") == []


CHAR_META = {"tokenizer": "char", "vocab_size": 4, "dtype": "uint16", "itos": list("abcd")}


@pytest.mark.parametrize("change,words", [
    (dict(stoi={"a": 1, "b": 0, "c": 2, "d": 3}), "stoi is not the inverse of itos"),
    (dict(itos=["a", "b", "c", "dd"]), "single characters"),
    (dict(vocab_size=True), "positive integer vocab_size"),
    (dict(vocab_size=70000, itos=[chr(i) for i in range(70000)]), "does not fit dtype uint16"),
    (dict(tokenizer="hf", eot=99, tokenizer_json="{}"), "eot 99"),
], ids=["stoi", "multi-char", "bool-vocab", "dtype-too-small", "hf-eot"])
def test_meta_that_would_train_wrong_is_refused(tmp_path, change, words):
    (tmp_path / "meta.json").write_text(json.dumps({**CHAR_META, **change}))
    with pytest.raises(UserError, match="meta.json") as e:
        read_meta(str(tmp_path))
    assert words in str(e.value) and "prepare.py" in str(e.value)


def test_good_char_meta_reads_back(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({**CHAR_META, "stoi": {c: i for i, c in enumerate("abcd")}}))
    assert read_meta(str(tmp_path))["itos"] == list("abcd")


def test_meta_pkl_with_a_gap_and_meta_json_folder_are_one_line(tmp_path):
    import pickle
    with open(tmp_path / "meta.pkl", "wb") as f:  # nanoGPT's layout, id 2 missing
        pickle.dump({"vocab_size": 3, "itos": {0: "a", 1: "b"}, "stoi": {"a": 0, "b": 1}}, f)
    with pytest.raises(UserError, match="no character for id 2"):
        read_meta(str(tmp_path))
    os.makedirs(tmp_path / "meta.json")
    with pytest.raises(UserError, match="is a folder"):
        read_meta(str(tmp_path))


def test_a_shard_that_is_a_folder_is_one_line(tmp_path):
    os.makedirs(tmp_path / "t_train_000001.bin")
    with pytest.raises(UserError, match="is a folder"):
        open_shard(str(tmp_path / "t_train_000001.bin"))


@pytest.mark.needs("datasets")
def test_rows_without_text_are_skipped_and_counted(docs, tmp_path):
    src, out = tmp_path / "docs.jsonl", tmp_path / "out"
    rows = [{"text": d} for d in docs[:10]] + [{"id": 1}, {"text": None}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    r = prepare(src, out, tmp_path / "hf_cache")
    assert r.returncode == 0 and "skipped 2 row(s) whose 'text' is missing, null or not text" in r.stdout, r.stderr
    names = list_shards(str(out), "val") + list_shards(str(out), "train")
    want = np.concatenate([np.array(t) for t in expected_tokens(docs[:10])])
    assert np.array_equal(np.concatenate([open_shard(name) for name in names]), want)


def write_pkl(folder, meta):
    import pickle
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def test_nanogpt_meta_pkl_with_a_list_itos_reads_as_ids(tmp_path):
    write_pkl(tmp_path, {"vocab_size": 3, "itos": ["a", "b", "c"], "stoi": {"a": 0, "b": 1, "c": 2}})
    assert read_meta(str(tmp_path))["itos"] == ["a", "b", "c"]


@pytest.mark.parametrize("meta,words", [
    ({"vocab_size": 2, "itos": ["a", "b"], "stoi": {"a": 1, "b": 0}}, "stoi is not the inverse of itos"),
    ({"vocab_size": 2, "itos": {"0": "a", "1": "b"}}, "itos's keys must be token ids"),
    ({"vocab_size": 2, "itos": {-1: "a", 0: "b"}}, "itos's keys must be token ids"),
    ({"itos": {0: "a", 1: "b"}}, "no positive integer vocab_size"),
    ({"vocab_size": 2, "itos": "ab"}, "itos is a str"),
    ({"vocab_size": 3, "itos": ["a", "b"]}, "vocab_size says 3, but itos has 2"),
    ([1, 2], "holds a list, not a dict"),
], ids=["stoi", "str-keys", "negative-key", "no-vocab_size", "str-itos", "short-list", "not-a-dict"])
def test_malformed_meta_pkl_is_one_line(tmp_path, meta, words):
    write_pkl(tmp_path, meta)
    with pytest.raises(UserError, match="meta.pkl") as e:
        read_meta(str(tmp_path))
    assert words in str(e.value)


@pytest.mark.parametrize("change,words", [
    (dict(dtype=["uint16"]), "unknown dtype ['uint16']"),
    (dict(tokenizer=["char"]), "unknown tokenizer"),
    (dict(tokenizer="hf", tokenizer_file=3), "tokenizer_file and tokenizer_json"),
], ids=["list-dtype", "list-tokenizer", "int-tokenizer_file"])
def test_meta_json_values_of_the_wrong_type_are_one_line(tmp_path, change, words):
    (tmp_path / "meta.json").write_text(json.dumps({**CHAR_META, **change}))
    with pytest.raises(UserError, match="meta.json") as e:
        read_meta(str(tmp_path))
    assert words in str(e.value)


def test_dataset_names_stay_in_data(tmp_path):
    from gpt.data import REPO, dataset_dir
    assert dataset_dir("shakespeare_char") == os.path.join(REPO, "data", "shakespeare_char")
    for name in ["../../x", "/etc", "a/b", "..", "", None]:
        with pytest.raises(UserError, match="not the name of a folder in data/"):
            dataset_dir(name)
