"""Datasets as people hold them, for data/openwebtext/prepare.py --local: compressed jsonl and csv, a
save_to_disk DatasetDict's own validation split, and --streaming giving the same bytes (on local files)."""
import gzip
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [f"document number {i} " * (i % 7 + 1) for i in range(40)]


def prepare(*args):
    r = subprocess.run([sys.executable, "data/openwebtext/prepare.py", "--num_proc=1", "--val_fraction=0.1",
                        *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def tokens(folder, split):
    return np.fromfile(os.path.join(folder, f"{split}.bin"), dtype=np.uint16)


def test_jsonl_gz_csv_and_streaming_give_the_same_bytes(tmp_path, gpt2_ranks_path):
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in DOCS)
    import csv
    with open(tmp_path / "docs.csv", "w", newline="") as f:
        csv.writer(f).writerows([["text", "id"]] + [[d, i] for i, d in enumerate(DOCS)])
    prepare("--local", tmp_path / "docs.jsonl.gz", "--out_dir", tmp_path / "a")
    prepare("--local", tmp_path / "docs.jsonl.gz", "--out_dir", tmp_path / "b", "--streaming")
    prepare("--local", tmp_path / "docs.csv", "--out_dir", tmp_path / "c")
    for split in ("train", "val"):
        assert tokens(tmp_path / "a", split).tobytes() == tokens(tmp_path / "b", split).tobytes()
        assert tokens(tmp_path / "a", split).tobytes() == tokens(tmp_path / "c", split).tobytes()
    assert (tokens(tmp_path / "a", "val") == 50256).sum() == 4  # ceil(40 * 0.1) documents


def test_a_dataset_dicts_validation_split_is_val(tmp_path, gpt2_ranks_path):
    import datasets

    from gpt.data import load_documents
    from gpt.tokenizer import gpt2_encoding
    dd = datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": DOCS[:30]}),
                              validation=datasets.Dataset.from_dict({"text": DOCS[30:]}))
    dd.save_to_disk(str(tmp_path / "saved"))
    out = prepare("--local", tmp_path / "saved", "--out_dir", tmp_path / "o")
    assert "'validation' split (10 documents) as val" in out
    enc = gpt2_encoding()
    expect = [t for d in DOCS[30:] for t in enc.encode_ordinary(d) + [50256]]
    assert tokens(tmp_path / "o", "val").tolist() == expect
    out = prepare("--local", tmp_path / "saved", "--out_dir", tmp_path / "s", "--streaming")
    assert tokens(tmp_path / "s", "val").tolist() == expect
    assert tokens(tmp_path / "s", "train").tobytes() == tokens(tmp_path / "o", "train").tobytes()
    # the streaming code path on local files: an IterableDataset
    stream = load_documents(str(tmp_path / "saved"), None, "text", streaming=True)
    assert isinstance(stream, datasets.IterableDataset) and [r["text"] for r in stream] == DOCS[:30]
