"""data/text/prepare.py, "your own text": a folder of text files -> data/<name>/ with characters or a BPE
trained on it, then config/train_text.py trains on it and sample.py samples from the checkpoint."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=1",
        "--max_iters=3", "--eval_interval=3", "--device=cpu", "--compile=False", "--dropout=0.0"]


def run(script, *args, check=True):
    r = subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=180)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture
def texts(tmp_path, shakespeare_text_path):
    with open(shakespeare_text_path) as f:
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
    out = tmp_path / "out"
    run("train.py", "config/train_text.py", f"--data_dir={data}", f"--out_dir={out}", *TINY)
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=20")
    assert "---------------" in r.stdout


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
    run("train.py", "config/train_text.py", f"--data_dir={data}", f"--out_dir={out}", *TINY)
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
def test_mistakes_are_one_line(args, words):
    r = run("data/text/prepare.py", *args, check=False)
    assert r.returncode != 0
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr
