"""
build-nanogpt's FineWeb-Edu shards (edufineweb_{train,val}_NNNNNN.npy, np.save of uint16 tokens) are read like
the llm.c-style .bin shards: same folder lookup, same batches; a folder that is not there names the real
prepare scripts.
"""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from gpt.data import find_dataset, list_shards, open_shard
from gpt.data.loader import make_loader
from gpt.data.sources import write_shard
from gpt.monitor.trainlog import read_log
from gpt.runtime.errors import UserError

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 50257, size=n).astype(np.uint16)


@pytest.fixture(scope="module")
def npy_dir(tmp_path_factory):
    """A folder as build-nanogpt's fineweb.py leaves it: shard 0 is val, the rest train, no meta.json."""
    d = tmp_path_factory.mktemp("edu_fineweb10B")
    np.save(d / "edufineweb_val_000000.npy", tokens(3000, 0))
    for i in (1, 2):
        np.save(d / f"edufineweb_train_{i:06d}.npy", tokens(5000, i))
    return d


def test_npy_shards_give_the_same_batches_as_bin_shards(npy_dir, tmp_path):
    for path in list_shards(npy_dir, "train") + list_shards(npy_dir, "val"):
        write_shard(tmp_path / os.path.basename(path).replace(".npy", ".bin"), np.load(path))
    assert [os.path.basename(p) for p in list_shards(npy_dir, "train")] == [
        "edufineweb_train_000001.npy", "edufineweb_train_000002.npy"]
    assert np.array_equal(open_shard(str(npy_dir / "edufineweb_val_000000.npy")), tokens(3000, 0))
    npy = make_loader(str(npy_dir), "train", 4, 64, "cpu", 50304)
    bins = make_loader(str(tmp_path), "train", 4, 64, "cpu", 50304)
    for _ in range(40):  # past the end of the first shard, into the second and around again
        (x1, y1), (x2, y2) = npy.next_batch(), bins.next_batch()
        assert x1.equal(x2) and y1.equal(y2)
    position = ("shard", "offset", "epoch")
    assert [npy.state_dict()[k] for k in position] == [bins.state_dict()[k] for k in position]
    assert npy.state_dict()["shard"] == 0


def test_a_bad_npy_shard_is_one_line(tmp_path):
    np.save(tmp_path / "x_train_000000.npy", np.zeros((4, 4), dtype=np.float32))
    with pytest.raises(UserError, match="not a 1-D uint16/uint32 array"):
        open_shard(str(tmp_path / "x_train_000000.npy"))
    (tmp_path / "y_train_000000.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError, match="not a readable .npy token shard"):
        open_shard(str(tmp_path / "y_train_000000.npy"))


def test_an_unknown_dataset_names_the_real_prepare_scripts():
    with pytest.raises(UserError) as e:
        find_dataset("npy")
    scripts = glob.glob(os.path.join(ROOT, "data", "*", "prepare.py"))
    choices = sorted(os.path.basename(os.path.dirname(p)) for p in scripts)
    assert f"python data/<{'|'.join(choices)}>/prepare.py" in str(e.value) and "text" in choices
    assert "data/npy/prepare.py" not in str(e.value)
    with pytest.raises(UserError, match="^data_dir /nowhere not found: .*`python data/fineweb/prepare.py "
                                        "--out_dir=/nowhere`"):
        find_dataset("fineweb", "/nowhere")  # --dataset=fineweb --data_dir=/nowhere
    with pytest.raises(UserError, match=r"`python data/<fineweb\|openwebtext\|.*>/prepare.py --out_dir=/nowhere`"):
        find_dataset("openwebtext", "/nowhere", named=False)  # --data_dir alone: openwebtext is only the default


def test_train_on_build_nanogpt_shards(npy_dir, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "train.py", "--dataset=edu_fineweb10B", f"--data_dir={npy_dir}",
                        f"--out_dir={out}", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=64",
                        "--batch_size=4", "--gradient_accumulation_steps=1", "--max_iters=3", "--eval_iters=1",
                        "--warmup_iters=1", "--lr_decay_iters=3", "--compile=False", "--device=cpu",
                        "--dtype=float32"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    log = read_log(out)
    assert [row["step"] for row in log if row["kind"] == "train"] == [0, 1, 2]
    assert [row["step"] for row in log if row["kind"] == "eval"] == [0, 3]
