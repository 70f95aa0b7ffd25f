"""
data/<dataset>/prepare.py: shakespeare_char, shakespeare (GPT-2 BPE), fetching tinyshakespeare; openwebtext
--local with datasets as people hold them (compressed jsonl and csv, a save_to_disk DatasetDict's own
validation split, --streaming giving the same bytes); data/text, "your own text": a folder of text files ->
data/<name>/ with characters or a BPE trained on it, that config/train_text.py trains on and sample.py samples.
"""
import csv
import gzip
import io
import json
import os
import random
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import ROOT, SHARED, run

from gpt.data import open_shard, open_tokens, read_meta
from gpt.data.sources import TINY_SHAKESPEARE_URL, tiny_shakespeare
from gpt.data.tokenizer import get_tokenizer
from gpt.runtime.errors import UserError

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


def last_lines(r):
    """A prepare script's last two lines: what it wrote where, and the command to run next (split off)."""
    wrote, next_line = r.stdout.strip().splitlines()[-2:]
    assert next_line.startswith("next: python train.py "), r.stdout[-2000:]
    return wrote, next_line[len("next: python "):].split()


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
    # it ends saying where it wrote and what to run: the recipe, pointed at the folder written
    wrote, command = last_lines(r)
    assert wrote == f"wrote {tmp_path}: train.bin ({len(train):,} tokens), val.bin ({len(val):,}), meta.json (65 " \
                    f"characters)"
    assert command == ["train.py", "config/train_shakespeare_char.py", f"--data_dir={tmp_path}"]


def test_shakespeare_bpe(text_path, gpt2_ranks_path, tmp_path):
    r = prepare("shakespeare", "--input", text_path, "--out_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "meta.json").read_text()) == {
        "tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "eot": 50256}
    tok, (train, val) = decode_splits(tmp_path)
    assert (len(train), len(val)) == expected_splits(text_path, tok)
    assert tok.decode(train) + tok.decode(val) == read_text(text_path)
    wrote, command = last_lines(r)
    assert wrote == f"wrote {tmp_path}: train.bin ({len(train):,} tokens), val.bin ({len(val):,}), meta.json"
    assert command == ["train.py", "config/finetune_shakespeare.py", f"--data_dir={tmp_path}"]


@pytest.mark.needs("datasets")
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
    wrote, command = last_lines(r)
    assert wrote == f"wrote {out}: train.bin ({len(train):,} tokens), val.bin ({len(val):,}), meta.json"
    assert command[:3] == ["train.py", "config/train_gpt2.py", f"--data_dir={out}"]


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
    r = prepare("shakespeare_char", "--input", tmp_path, "--out_dir", tmp_path / "out")  # a folder, not a file
    assert r.returncode == 2 and r.stderr.strip() == f"error: input file {tmp_path} is a folder: give the text " \
                                                      f"file itself (data/text/prepare.py takes folders)", r.stderr


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


def test_without_the_datasets_package_it_is_one_line(gpt2_ranks_path, tmp_path):
    # as on the GPU machines, which have no datasets (tests/without/ hides it from the scripts here)
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"text": "a document"}) + "\n")
    env = {"NANOGPT_WITHOUT": "datasets", "PYTHONPATH": os.path.join(ROOT, "tests", "without")}
    for dataset in ("openwebtext", "fineweb"):
        r = prepare(dataset, "--local", src, "--out_dir", tmp_path / "out", env=env)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            "error: reading documents needs the datasets package (Hugging Face): pip install datasets"], r.stderr
        assert not (tmp_path / "out").exists()


# openwebtext --local: datasets as people hold them

DOCS = [f"document number {i} " * (i % 7 + 1) for i in range(40)]


def prepare_local(*args):
    return run("data/openwebtext/prepare.py", "--num_proc=1", "--val_fraction=0.1", *args).stdout


def tokens(folder, split):
    return np.fromfile(os.path.join(folder, f"{split}.bin"), dtype=np.uint16)


@pytest.mark.needs("datasets")
def test_jsonl_gz_csv_and_streaming_give_the_same_bytes(tmp_path, gpt2_ranks_path):
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in DOCS)
    with open(tmp_path / "docs.csv", "w", newline="") as f:
        csv.writer(f).writerows([["text", "id"]] + [[d, i] for i, d in enumerate(DOCS)])
    prepare_local("--local", tmp_path / "docs.jsonl.gz", "--out_dir", tmp_path / "a")
    prepare_local("--local", tmp_path / "docs.jsonl.gz", "--out_dir", tmp_path / "b", "--streaming")
    prepare_local("--local", tmp_path / "docs.csv", "--out_dir", tmp_path / "c")
    for split in ("train", "val"):
        assert tokens(tmp_path / "a", split).tobytes() == tokens(tmp_path / "b", split).tobytes()
        assert tokens(tmp_path / "a", split).tobytes() == tokens(tmp_path / "c", split).tobytes()
    assert (tokens(tmp_path / "a", "val") == 50256).sum() == 4  # ceil(40 * 0.1) documents


@pytest.mark.needs("datasets")
def test_a_dataset_dicts_validation_split_is_val(tmp_path, gpt2_ranks_path):
    import datasets

    from gpt.data.sources import load_documents
    from gpt.data.tokenizer import gpt2_encoding
    dd = datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": DOCS[:30]}),
                              validation=datasets.Dataset.from_dict({"text": DOCS[30:]}))
    dd.save_to_disk(str(tmp_path / "saved"))
    out = prepare_local("--local", tmp_path / "saved", "--out_dir", tmp_path / "o")
    assert "'validation' split (10 documents) as val" in out
    enc = gpt2_encoding()
    expect = [t for d in DOCS[30:] for t in enc.encode_ordinary(d) + [50256]]
    assert tokens(tmp_path / "o", "val").tolist() == expect
    out = prepare_local("--local", tmp_path / "saved", "--out_dir", tmp_path / "s", "--streaming")
    assert tokens(tmp_path / "s", "val").tolist() == expect
    assert tokens(tmp_path / "s", "train").tobytes() == tokens(tmp_path / "o", "train").tobytes()
    # the streaming code path on local files: an IterableDataset
    stream = load_documents(str(tmp_path / "saved"), None, "text", streaming=True)
    assert isinstance(stream, datasets.IterableDataset) and [r["text"] for r in stream] == DOCS[:30]


# data/text/prepare.py: your own text

TEXT_TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=1",
        "--max_iters=3", "--eval_interval=3", "--device=cpu", "--compile=False", "--dropout=0.0"]


@pytest.fixture
def texts(tmp_path, corpus_path):
    with open(corpus_path) as f:
        text = f.read()
    folder = tmp_path / "texts"
    (folder / "part2").mkdir(parents=True)
    (folder / "a.txt").write_text(text[:6000])
    (folder / "part2" / "b.md").write_text(text[6000:9000])
    (folder / "ignored.bin").write_text("\x00 not text")
    return folder, text


def test_char_folder_trains_and_samples(tmp_path, texts):
    folder, text = texts
    data = tmp_path / "mine"
    r = run("data/text/prepare.py", "--input", folder, "--out_dir", data, "--block_size=32")
    assert "2 file(s), 9,000 characters" in r.stdout
    meta = json.loads((data / "meta.json").read_text())
    assert meta["tokenizer"] == "char"
    train = np.fromfile(data / "train.bin", dtype=np.uint16)
    val = np.fromfile(data / "val.bin", dtype=np.uint16)
    assert (len(train), len(val)) == (8100, 900)  # the files in path order, joined; the last 10% is val
    assert "".join(meta["itos"][i] for i in np.concatenate([train, val])) == text[:9000]
    # the command it ends with trains on what it wrote, at the context it was prepared for
    wrote, command = last_lines(r)
    assert wrote == f"wrote {data}: train.bin (8,100 tokens), val.bin (900), meta.json (char tokenizer, " \
                    f"{meta['vocab_size']} tokens)"
    assert command == ["train.py", "config/train_text.py", f"--data_dir={data}", "--block_size=32"]
    out = tmp_path / "out"
    run(*command, f"--out_dir={out}", *TEXT_TINY)
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=20")
    assert "---------------" in r.stdout


@pytest.mark.needs("tokenizers")
def test_trained_bpe_separates_documents_with_eot(tmp_path, texts):
    folder, _ = texts
    data = tmp_path / "bpe"
    # one block's worth at least: 10% of the tokens is fewer than --block_size + 1
    run("data/text/prepare.py", "--input", folder / "a.txt", folder / "part2" / "b.md", "--out_dir", data,
        "--tokenizer=train", "--vocab_size=300", "--block_size=700")
    meta = json.loads((data / "meta.json").read_text())
    assert meta["tokenizer"] == "hf" and (data / "tokenizer.json").exists()
    ids = np.concatenate([np.fromfile(data / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert len(np.fromfile(data / "val.bin", dtype=np.uint16)) == 701
    assert (ids == meta["eot"]).sum() == 2 and ids[-1] == meta["eot"]  # after each of the two documents
    out = tmp_path / "out"
    run("train.py", "config/train_text.py", f"--data_dir={data}", f"--out_dir={out}", *TEXT_TINY)
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=3", "--max_new_tokens=40",
            "--top_p=0.9", "--stop_at_eot=True", "--start=<|endoftext|>")
    assert "(300 tokens)" in r.stdout
    # each sample is printed up to its first new end-of-text: only the prompt's is left
    assert r.stdout[r.stdout.index("tokenizer:"):].count("<|endoftext|>") == 3
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", "--top_p=1.5", check=False)
    assert r.returncode != 0 and r.stderr.startswith("error: ") and "top_p" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--input", "nowhere.txt", "--name=x"], ["nowhere.txt", "does not exist"]),
    (["--input", "README.md"], ["--name"]),
    (["--input", "README.md", "--name=a/b"], ["--name", "plain folder name"]),
    (["--input", "README.md", "--name=x", "--block_size=100000"], ["too few", "--block_size"]),
])
def test_text_mistakes_are_one_line(args, words):
    r = run("data/text/prepare.py", *args, check=False)
    assert r.returncode != 0
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr


def test_compressed_and_other_encodings_read_as_their_text(tmp_path, texts):
    """A corpus as it often comes: gzip/bz2/xz compressed, in Latin-1, or UTF-8 with a few stray bytes."""
    import bz2
    import gzip
    import lzma
    folder, text = texts
    plain = tmp_path / "plain"
    run("data/text/prepare.py", "--input", folder, "--out_dir", plain, "--block_size=32")
    packed = tmp_path / "packed"
    (packed / "part2").mkdir(parents=True)
    (packed / "a.txt.gz").write_bytes(gzip.compress((folder / "a.txt").read_bytes()))
    (packed / "part2" / "b.md.bz2").write_bytes(bz2.compress((folder / "part2" / "b.md").read_bytes()))
    (packed / "c.bin.xz").write_bytes(lzma.compress(b"\x00 not text"))  # not a text name: left out
    data = tmp_path / "from_packed"
    r = run("data/text/prepare.py", "--input", packed, "--out_dir", data, "--block_size=32")
    assert "2 file(s), 9,000 characters" in r.stdout
    for name in ("train.bin", "val.bin", "meta.json"):  # the same dataset as from the plain files
        assert (data / name).read_bytes() == (plain / name).read_bytes(), name

    latin = tmp_path / "latin.txt.xz"
    latin.write_bytes(lzma.compress(("café déjà vu " * 40).encode("latin-1")))
    r = run("data/text/prepare.py", "--input", latin, "--out_dir", tmp_path / "x", "--block_size=32", check=False)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: {latin} is not utf-8 text (invalid continuation byte at byte 3 of its uncompressed text): "
        f"convert it, leave it out, or pass --errors=replace (U+FFFD for each byte that does not decode)")
    r = run("data/text/prepare.py", "--input", latin, "--out_dir", tmp_path / "l1", "--block_size=32",
            "--encoding=latin-1")
    assert set(json.loads((tmp_path / "l1" / "meta.json").read_text())["itos"]) == set("café déjàvu")
    r = run("data/text/prepare.py", "--input", latin, "--out_dir", tmp_path / "rep", "--block_size=32",
            "--errors=replace")
    assert "120 U+FFFD characters in the text" in r.stdout  # é, é and à, 40 times over

    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(text.encode())[:500])
    for args, line in [([cut], f"error: {cut} could not be read (Compressed file ended before the "
                                f"end-of-stream marker was reached): its gzip data is damaged"),
                       ([latin, "--encoding=klingon"], "error: --encoding 'klingon' is not a text encoding Python "
                                                       "knows (e.g. utf-8, latin-1)")]:
        r = run("data/text/prepare.py", "--input", *args, "--out_dir", tmp_path / "y", check=False)
        assert r.returncode == 2 and r.stderr.strip() == line, r.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.needs("datasets")
def test_rows_without_text_are_skipped_and_counted_and_a_file_that_is_not_its_kind_is_one_line(tmp_path,
                                                                                              gpt2_ranks_path):
    """Real exports have rows without the text field, or with null there: they are no document, said in a
    line (a traceback from inside datasets' map before); a .jsonl that is not JSON is one line."""
    rows = [{"text": d} for d in DOCS] + [{"id": 1}, {"text": None}, {"text": 7}]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "clean.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    for extra in ([], ["--streaming"]):
        out = prepare_local("--local", tmp_path / "docs.jsonl", "--out_dir", tmp_path / "with", *extra)
        assert "skipped 3 row(s) whose 'text' is missing, null or not text" in out
    prepare_local("--local", tmp_path / "clean.jsonl", "--out_dir", tmp_path / "clean")
    n = lambda folder: sum(len(tokens(folder, s)) for s in ("train", "val"))  # noqa: E731
    assert n(tmp_path / "with") == n(tmp_path / "clean")  # the same documents' tokens, nothing for the 3 rows
    (tmp_path / "broken.jsonl").write_text("not json at all\n")
    r = run("data/openwebtext/prepare.py", "--local", tmp_path / "broken.jsonl", "--out_dir", tmp_path / "x",
            check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # datasets logs its own line before
    assert r.stderr.strip().splitlines()[-1] == (f"error: --local {tmp_path / 'broken.jsonl'}: could not read it as "
                                                 f"json (ArrowInvalid: JSON parse error: Invalid value. in row 0)")


@pytest.mark.needs("datasets")
def test_fineweb_ends_with_its_shards_and_the_command_that_trains_on_them(tmp_path, gpt2_ranks_path):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:10]))
    out = tmp_path / "out"
    r = prepare("fineweb", "--local", tmp_path / "docs.jsonl", "--out_dir", out, "--shard_size=40", "--num_proc=1",
                env={"HF_DATASETS_CACHE": str(tmp_path / "hf_cache")})
    assert r.returncode == 0, r.stderr
    sizes = [len(open_shard(os.path.join(out, name))) for name in sorted(os.listdir(out))
             if name.endswith(".bin")]
    wrote, command = last_lines(r)
    assert wrote == f"wrote {out}: {len(sizes)} shards, 1 val (40 tokens) and {len(sizes) - 1} train " \
                    f"({sum(sizes) - 40:,} tokens), meta.json"
    assert command[:3] == ["train.py", "config/train_gpt2_fineweb.py", f"--data_dir={out}"]


@pytest.mark.parametrize("script, args", [
    ("shakespeare_char", ["--input", "{text}"]), ("shakespeare", ["--input", "{text}"]),
    ("text", ["--input", "{text}"]), ("openwebtext", ["--local", "{jsonl}"]), ("fineweb", ["--local", "{jsonl}"])])
def test_an_out_dir_that_cannot_be_made_is_one_line(script, args, tmp_path, text_path, gpt2_ranks_path):
    if script in ("openwebtext", "fineweb"):
        pytest.importorskip("datasets", reason="the hub-dataset scripts read --local files with datasets")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    taken = tmp_path / "a_file"
    taken.write_text("mine")
    args = [a.format(text=text_path, jsonl=tmp_path / "docs.jsonl") for a in args]
    for out, line in [(taken, f"error: --out_dir {taken} is a file, not a folder: choose another --out_dir"),
                      (taken / "sub", f"error: cannot create --out_dir {taken / 'sub'} (Not a directory): choose "
                                      f"another --out_dir")]:
        r = run(f"data/{script}/prepare.py", *args, "--out_dir", out, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1] == line
    assert taken.read_text() == "mine"
