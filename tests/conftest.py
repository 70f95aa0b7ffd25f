import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
sys.path.insert(0, ROOT)

# GPT-2 BPE offline: tiktoken cannot download its files here, so point the loader at the local ranks file.
_ranks = os.path.join(SHARED, "gpt2.tiktoken")
if os.path.exists(_ranks):
    os.environ.setdefault("GPT2_TIKTOKEN_FILE", _ranks)
# One OpenMP/MKL thread per torch process, this one (torch is imported after this file) and every script the
# tests start: two processes at once on CI's 2 cores (DDP ranks, test_errors' pool, pytest -n 2) each with
# threads that spin-wait for a core the other holds ran 5-12x slower than with one thread each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def shakespeare_text_path():
    path = os.path.join(SHARED, "tinyshakespeare.txt")
    if not os.path.exists(path):
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="session")
def gpt2_ranks_path():
    if not os.path.exists(_ranks):
        pytest.skip(f"{_ranks} not present")
    return _ranks


def write_char_dataset(folder, text_path, chars=100000):
    """A character-level dataset of the first `chars` characters of text_path in folder: meta.json, and
    train.bin / val.bin split 90/10, as data/shakespeare_char/prepare.py writes them. Returns the folder."""
    from gpt.data import write_meta, write_tokens
    from gpt.tokenizer import char_meta, get_tokenizer
    with open(text_path) as f:
        text = f.read()
    meta = char_meta(text)
    os.makedirs(folder, exist_ok=True)
    write_meta(folder, meta)
    ids = get_tokenizer(meta).encode(text[:chars])
    split = chars * 9 // 10
    write_tokens(os.path.join(folder, "train.bin"), ids[:split])
    write_tokens(os.path.join(folder, "val.bin"), ids[split:])
    return folder
