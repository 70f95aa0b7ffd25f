"""
The package as pip installs it: a wheel built from pyproject.toml, installed into a fresh virtual environment
(with the system's torch, numpy, ... : --system-site-packages, no network), imports from outside the
checkout and trains a tiny model with the library alone, saves it and loads it back with the same logits.
"""
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

# run from a folder outside the checkout: every import must come from the installed wheel
TRAIN = r"""
import os, sys
import numpy as np, torch
import gpt, model
from gpt import checkpoint
from gpt.data import find_dataset
from gpt.data.sources import write_meta, write_tokens
from gpt.data.loader import make_loader
site = sys.argv[1]
assert gpt.__file__.startswith(site) and model.__file__.startswith(site), (gpt.__file__, model.__file__)
ids = np.arange(3000) % 16
os.makedirs("data")
write_meta("data", {"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": list("abcdefghijklmnop")})
write_tokens("data/train.bin", ids)
write_tokens("data/val.bin", ids[:500])
data_dir, meta, _ = find_dataset("tiny", "data")
torch.manual_seed(0)
net = model.GPT(model.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=17, dropout=0.0))
opt = net.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
batches = make_loader(data_dir, "train", 4, 16, "cpu", 16)
losses = []
for _ in range(20):
    x, y = batches.next_batch()
    _, loss = net(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
assert losses[-1] < losses[0], losses
os.makedirs("out")
assert checkpoint.Saver("out").save(net, opt, model_args=net.config.checkpoint_args(), iter_num=20,
                                   dataset_meta=meta)
again, meta_again = checkpoint.load_model("resume", "out")
x, _ = batches.next_batch()
assert torch.equal(net.eval()(x)[0], again.eval()(x)[0]) and meta_again == meta
print("trained from the wheel:", round(losses[0], 3), "->", round(losses[-1], 3))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of a copy of the checkout's tracked files (the build leaves the checkout untouched)."""
    tmp = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    src = tmp / "src"
    for f in files:
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(src / os.path.dirname(f), exist_ok=True)
            shutil.copy(os.path.join(ROOT, f), src / f)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    if r.returncode and "setuptools" in r.stderr and "No module named" in r.stderr:
        pytest.skip("setuptools is not installed, so no wheel can be built offline (pip install setuptools)")
    assert r.returncode == 0, r.stderr[-3000:]
    (path,) = (tmp / "dist").glob("*.whl")
    return path


def test_wheel_holds_the_package_and_the_modules_it_imports(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {"model.py", "configurator.py", "gpt/__init__.py", "gpt/checkpoint/__init__.py"} <= set(names)
    assert any(n.startswith("gpt/monitor/dashboard_static/") for n in names)  # the page's chart library
    assert "train.py" not in names  # the scripts stay in the checkout


def test_installed_wheel_imports_and_trains(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([python, "-c", TRAIN, site], cwd=work, capture_output=True, text=True, timeout=300,
                       env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained from the wheel" in r.stdout
