"""
User mistakes through the real command line: each must end the run with status 2 and one line on stderr,
`error: ...`, that names what is wrong - never a traceback.

Every case is a fresh `python train.py` / `python sample.py` (2-3 s of torch import each), so the cases run
in a small thread pool, started when the first case is needed; each test waits for its own result.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import ROOT
from conftest import run as run_script

WORKERS = max(2, min(4, os.cpu_count() or 2))
ITOS = list("abcdefghijklmnop")  # the tiny datasets' 16 characters

# a model small enough that the runs which get as far as training finish in a second
TRAIN_BASE = ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16",
              "--batch_size=4", "--gradient_accumulation_steps=1", "--max_iters=2", "--eval_interval=2",
              "--eval_iters=1", "--dataset=tiny"]
SAMPLE_BASE = ["--device=cpu", "--num_samples=1", "--max_new_tokens=5"]


def write_dataset(folder, train=None, val=None, vocab_size=16, meta=True, train_bytes=None):
    """train.bin / val.bin / meta.json, written directly (None leaves a file out)."""
    os.makedirs(folder, exist_ok=True)
    if train is not None:
        with open(os.path.join(folder, "train.bin"), "wb") as f:
            f.write(np.asarray(train, dtype=np.uint16).tobytes() if train_bytes is None else train_bytes)
    if val is not None:
        np.asarray(val, dtype=np.uint16).tofile(os.path.join(folder, "val.bin"))
    if meta:
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"tokenizer": "char", "vocab_size": vocab_size, "dtype": "uint16",
                       "itos": ITOS[:vocab_size]}, f)
    return folder


def good_ids(n, seed=0):
    return np.random.default_rng(seed).integers(0, 16, n)


def run(script, args, timeout=180):
    return run_script(script, *args, check=False, timeout=timeout)


class Shared:
    """Inputs several cases use, each made once, on first use, by whichever thread needs it first."""

    def __init__(self, root):
        self.root = root
        self._lock = threading.Lock()
        self._locks, self._made = {}, {}

    def _once(self, name, make):
        with self._lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._made:
                self._made[name] = make(os.path.join(self.root, name))
            return self._made[name]

    def data(self):
        """A valid 16-character dataset."""
        return self._once("data", lambda d: write_dataset(d, good_ids(4000), good_ids(1000, seed=1)))

    def checkpoint(self):
        """An out_dir holding a real ckpt.pt, written by train.py."""
        def make(out_dir):
            r = run("train.py", TRAIN_BASE + [f"--data_dir={self.data()}", f"--out_dir={out_dir}"])
            assert r.returncode == 0 and os.path.exists(os.path.join(out_dir, "ckpt.pt")), r.stderr[-3000:]
            return out_dir
        return self._once("ckpt", make)

    def truncated_checkpoint(self):
        """An out_dir whose ckpt.pt is the first half of a real one."""
        def make(out_dir):
            with open(os.path.join(self.checkpoint(), "ckpt.pt"), "rb") as f:
                blob = f.read()
            os.makedirs(out_dir)
            with open(os.path.join(out_dir, "ckpt.pt"), "wb") as f:
                f.write(blob[:len(blob) // 2])
            return out_dir
        return self._once("truncated", make)

    def pretrained(self):
        """A tiny GPT-2 saved by transformers' save_pretrained, with a 32-token context."""
        def make(folder):
            code = ("import sys; from transformers import GPT2Config, GPT2LMHeadModel; "
                    "GPT2LMHeadModel(GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=2, vocab_size=16))"
                    ".save_pretrained(sys.argv[1])")
            r = subprocess.run([sys.executable, "-c", code, folder], capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stderr[-3000:]
            return folder
        return self._once("gpt2-tiny", make)


def unsafe_checkpoint(tmp, shared):
    """A ckpt.pt that torch.load(weights_only=True) refuses: it pickles an object of a class."""
    ckpt = torch.load(os.path.join(shared.checkpoint(), "ckpt.pt"), weights_only=True)
    ckpt["args"] = argparse.Namespace(lr=1.0)
    out_dir = os.path.join(tmp, "unsafe")
    os.makedirs(out_dir)
    torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
    return out_dir


def bad_meta(tmp):
    folder = write_dataset(os.path.join(tmp, "d"), good_ids(100), good_ids(100), meta=False)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        f.write('{"vocab_size": 16,')  # cut off mid-write
    return folder


def not_writable(tmp):
    with open(os.path.join(tmp, "afile"), "w") as f:
        f.write("a regular file, so nothing can be created under it\n")
    return os.path.join(tmp, "afile", "sub")


# (id, script, args(tmp, shared) -> the case's own arguments, words its error line must hold)
# train.py cases get TRAIN_BASE, a valid --data_dir and an empty --out_dir first; the case's arguments win.
CASES = [
    ("block_size_beyond_pretrained", "train.py",
     lambda tmp, s: [f"--init_from={s.pretrained()}", "--block_size=64"], ["block_size=64", "32"]),
    ("missing_dataset_folder", "train.py",
     lambda tmp, s: ["--dataset=no_such_dataset", "--data_dir="],
     ["no_such_dataset", "python data/<fineweb|openwebtext|shakespeare|shakespeare_char|text>/prepare.py"]),
    ("missing_train_bin", "train.py",
     lambda tmp, s: [f"--data_dir={write_dataset(os.path.join(tmp, 'd'), val=good_ids(100))}"],
     ["train.bin", "python data/<fineweb|"]),
    ("unknown_init_from", "train.py", lambda tmp, s: ["--init_from=scartch"], ["init_from", "scartch"]),
    ("resume_without_checkpoint", "train.py", lambda tmp, s: ["--init_from=resume"], ["no checkpoint", "ckpt.pt"]),
    ("unknown_config_key", "train.py", lambda tmp, s: ["--batch_sise=4"], ["batch_sise"]),
    ("wrong_type", "train.py", lambda tmp, s: ["--batch_size=abc"], ["batch_size", "int", "abc"]),
    ("cuda_on_cpu_machine", "train.py", lambda tmp, s: ["--device=cuda"], ["cuda", "not available"]),
    ("float16_on_cpu", "train.py", lambda tmp, s: ["--dtype=float16"], ["float16"]),
    ("eval_iters_zero", "train.py", lambda tmp, s: ["--eval_iters=0"], ["eval_iters"]),
    ("bin_not_whole_tokens", "train.py",
     lambda tmp, s: ["--data_dir=" + write_dataset(os.path.join(tmp, 'd'), [0], good_ids(100),
                                                   train_bytes=bytes(2001))],
     ["train.bin", "2001 bytes"]),
    ("token_ids_beyond_vocab", "train.py",
     lambda tmp, s: ["--data_dir=" + write_dataset(os.path.join(tmp, 'd'), good_ids(4000), good_ids(100),
                                                   vocab_size=8)],
     ["train.bin", "token id 15", "vocabulary's 8 ids"]),
    # id 16 is the model's (17 ids: the end-of-text id a character model gets), but no character's
    ("token_id_of_no_character", "train.py",
     lambda tmp, s: ["--data_dir=" + write_dataset(os.path.join(tmp, 'd'), [*good_ids(4000), 16], good_ids(100))],
     ["train.bin", "token id 16", "vocabulary's 16 ids"]),
    ("dataset_shorter_than_block", "train.py",
     lambda tmp, s: [f"--data_dir={write_dataset(os.path.join(tmp, 'd'), good_ids(10), good_ids(100))}"],
     ["train.bin", "10 tokens", "block_size=16"]),
    ("meta_json_not_json", "train.py",
     lambda tmp, s: [f"--data_dir={bad_meta(tmp)}"], ["meta.json", "not valid JSON"]),
    ("truncated_checkpoint_resume", "train.py",
     lambda tmp, s: ["--init_from=resume", f"--out_dir={s.truncated_checkpoint()}"], ["ckpt.pt", "truncated"]),
    ("unsafe_checkpoint_resume", "train.py",
     lambda tmp, s: ["--init_from=resume", f"--out_dir={unsafe_checkpoint(tmp, s)}"],
     ["ckpt.pt", "unsafe", "argparse.Namespace", "could run code"]),
    ("out_dir_not_writable", "train.py", lambda tmp, s: [f"--out_dir={not_writable(tmp)}"],
     ["out_dir", os.path.join("afile", "sub"), "not writable"]),
    ("missing_config_file", "train.py", lambda tmp, s: ["config/no_such_config.py"], ["no_such_config.py"]),
    ("sample_unknown_init_from", "sample.py", lambda tmp, s: ["--init_from=gtp2"], ["init_from", "gtp2"]),
    ("sample_truncated_checkpoint", "sample.py", lambda tmp, s: [f"--out_dir={s.truncated_checkpoint()}"],
     ["ckpt.pt", "truncated"]),
    ("sample_char_not_in_vocab", "sample.py", lambda tmp, s: [f"--out_dir={s.checkpoint()}", "--start=~"],
     ["'~'", "vocabulary"]),
    ("sample_missing_prompt_file", "sample.py",
     lambda tmp, s: [f"--out_dir={s.checkpoint()}", f"--start=FILE:{os.path.join(tmp, 'prompt.txt')}"],
     ["prompt.txt", "not found"]),
]



def config_file(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def binary_prompt(tmp):
    path = os.path.join(tmp, "prompt.bin")
    with open(path, "wb") as f:
        f.write(b"ab\xff\xfe\x80cd")
    return path


def other_characters(tmp):
    """A dataset like the shared one, its 16 ids meaning other characters."""
    folder = write_dataset(os.path.join(tmp, "d"), good_ids(4000), good_ids(1000, seed=1), meta=False)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": ITOS[::-1]}, f)
    return folder


# values of the right type that make no sense, config files that break, prompts that are not text (issue 15)
CASES += [
    ("dropout_above_1", "train.py", lambda tmp, s: ["--dropout=1.5"], ["dropout=1.5", "below 1"]),
    ("learning_rate_negative", "train.py", lambda tmp, s: ["--learning_rate=-1"], ["learning_rate=-1", "positive"]),
    ("n_layer_zero", "train.py", lambda tmp, s: ["--n_layer=0"], ["n_layer=0", "positive"]),
    ("config_file_syntax_error", "train.py", lambda tmp, s: [config_file(tmp, "broken.py", "batch_size = = 4\n")],
     ["broken.py", "not valid Python", "line 1"]),
    ("config_file_raises", "train.py",
     lambda tmp, s: [config_file(tmp, "raises.py", "import math\nbatch_size = 1 // 0\n")],
     ["raises.py", "line 2", "ZeroDivisionError"]),
    ("resume_on_other_characters", "train.py",
     lambda tmp, s: ["--init_from=resume", f"--out_dir={s.checkpoint()}", f"--data_dir={other_characters(tmp)}"],
     ["characters, 16 of them", "data/shakespeare_char/prepare.py"]),
    ("sample_top_k_negative", "sample.py", lambda tmp, s: [f"--out_dir={s.checkpoint()}", "--top_k=-5"],
     ["top_k=-5"]),
    ("sample_prompt_not_utf8", "sample.py",
     lambda tmp, s: [f"--out_dir={s.checkpoint()}", f"--start=FILE:{binary_prompt(tmp)}"], ["prompt.bin", "UTF-8"]),
    ("sample_max_new_tokens_negative", "sample.py", lambda tmp, s: ["--max_new_tokens=-1"], ["max_new_tokens=-1"]),
    ("sample_num_samples_negative", "sample.py", lambda tmp, s: ["--num_samples=-3"], ["num_samples=-3"]),
    ("sample_temperature_negative", "sample.py", lambda tmp, s: ["--temperature=-1"], ["temperature=-1"]),
]


def run_case(case, tmp, shared):
    _, script, make_args, _ = case
    args = make_args(tmp, shared)
    if script == "train.py":
        args = TRAIN_BASE + [f"--data_dir={shared.data()}", f"--out_dir={os.path.join(tmp, 'out')}"] + args
    else:
        args = SAMPLE_BASE + args
    return args, run(script, args)


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    """Start the selected cases (those pytest will run) in a thread pool; {id: future}."""
    wanted = {item.callspec.params["case"][0] for item in request.session.items
              if getattr(item, "originalname", None) == "test_user_mistake" and item.module.__name__ == __name__}
    shared = Shared(tmp_path_factory.mktemp("shared"))
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    futures = {case[0]: pool.submit(run_case, case, str(tmp_path_factory.mktemp(case[0])), shared)
               for case in CASES if case[0] in wanted}  # slowest first: CASES starts with the GPT-2 one
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_user_mistake(case, outcomes):
    _, script, _, words = case
    if case[0] == "cuda_on_cpu_machine" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    args, r = outcomes[case[0]].result()
    where = f"python {script} {' '.join(args)}\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-3000:]}"
    assert r.returncode == 2, where
    assert "Traceback" not in r.stderr, where
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), where
    for word in words:
        assert word in last, f"{word!r} not in {last!r}"


def test_ctrl_c_before_training_is_one_short_line(tmp_path):
    """Ctrl-C while train.py starts (torch still loading, or the data being checked): no traceback, status 130."""
    import signal
    import time
    p = subprocess.Popen([sys.executable, "train.py", *TRAIN_BASE, f"--out_dir={tmp_path}"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5)  # errors.install() runs first, before torch is imported
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C)", err[-3000:]
