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
