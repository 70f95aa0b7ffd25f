"""
User mistakes through the real command line: each must end the run with status 2 and one line on stderr,
`error: ...`, that names what is wrong - never a traceback.

Every case is a fresh `python train.py` / `python sample.py` (2-3 s of torch import each), so the cases run
in a small thread pool, started when the first case is needed; each test waits for its own result.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import FORKED_TORCHRUN, ROOT
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


def opcode_checkpoint(tmp, shared):
    """A ckpt.pt whose pickle uses an opcode torch.load(weights_only=True) refuses (INST, protocol 0): torch's
    message for it advises weights_only=False, which must not reach the user."""
    import zipfile
    out_dir = os.path.join(tmp, "opcode")
    os.makedirs(out_dir)
    with zipfile.ZipFile(os.path.join(shared.checkpoint(), "ckpt.pt")) as src, \
            zipfile.ZipFile(os.path.join(out_dir, "ckpt.pt"), "w") as dst:
        for item in src.infolist():
            data = b"(i__builtin__\nobject\n." if item.filename.endswith("data.pkl") else src.read(item.filename)
            dst.writestr(item, data)
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
     ["error: data_dir ", "has no train split", "train.bin", "python data/<fineweb|", "prepare.py --out_dir="]),
    ("data_dir_tokenized_otherwise", "train.py",  # the message names the folder given, not --dataset's default
     lambda tmp, s: ["--init_from=resume", f"--out_dir={s.checkpoint()}", "--dataset=openwebtext",
                     f"--data_dir={write_dataset(os.path.join(tmp, 'd'), good_ids(4000), good_ids(1000), meta=False)}"],
     ["error: data_dir ", "is tokenized with GPT-2 BPE, but the model"]),
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
    ("unsafe_opcode_checkpoint_resume", "train.py",
     lambda tmp, s: ["--init_from=resume", f"--out_dir={opcode_checkpoint(tmp, s)}"],
     ["ckpt.pt", "unsafe", "Unsupported operand", "could run code"]),
    ("out_dir_not_writable", "train.py", lambda tmp, s: [f"--out_dir={not_writable(tmp)}"],
     ["out_dir", os.path.join("afile", "sub"), "cannot be made", "is a file, not a folder"]),
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


# values of the right type that make no sense, config files that break, prompts that are not text
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


def folder_with(tmp, files):
    """A folder holding the given {name: text} files."""
    folder = os.path.join(tmp, "folder")
    os.makedirs(folder)
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder


def pretrained_with(tmp, shared, **fields):
    """A copy of the tiny transformers GPT-2 whose config.json has other values for some fields."""
    import shutil
    folder = os.path.join(tmp, "hf")
    shutil.copytree(shared.pretrained(), folder)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, **fields}, f)
    return folder


def dataset_with_meta(tmp, **meta):
    """The tiny dataset with this meta.json instead."""
    folder = write_dataset(os.path.join(tmp, "d"), good_ids(4000), good_ids(1000, seed=1), meta=False)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f)
    return folder


def train_bin_folder(tmp):
    """A dataset whose train.bin is a folder."""
    folder = write_dataset(os.path.join(tmp, "d"), val=good_ids(1000))
    os.makedirs(os.path.join(folder, "train.bin"))
    return folder


# tracebacks for user errors, values accepted that mean nothing, config files that end the run
# unseen, metadata that trains silently wrong, folders that are not transformers models
CASES += [
    ("dashboard_port_beyond_65535", "train.py", lambda tmp, s: ["--dashboard=True", "--dashboard_port=99999"],
     ["dashboard_port=99999", "65535"]),
    ("dashboard_script_port_beyond_65535", "dashboard.py", lambda tmp, s: [f"--out_dir={tmp}", "--port=99999"],
     ["port=99999", "65535"]),
    ("train_bin_is_a_folder", "train.py", lambda tmp, s: [f"--data_dir={train_bin_folder(tmp)}"],
     ["train.bin", "is a folder"]),
    ("seed_negative", "train.py", lambda tmp, s: ["--seed=-5"], ["seed=-5", "2**63"]),
    ("seed_beyond_2_63", "train.py", lambda tmp, s: [f"--seed={2**64}"], [f"seed={2**64}", "2**63"]),
    ("sample_seed_negative", "sample.py", lambda tmp, s: ["--seed=-5"], ["seed=-5", "2**63"]),
    ("sample_seed_beyond_2_63", "sample.py", lambda tmp, s: [f"--seed={2**63}"], [f"seed={2**63}"]),
    ("init_from_empty_folder", "train.py", lambda tmp, s: [f"--init_from={folder_with(tmp, {})}"],
     ["no config.json", "not a transformers model"]),
    ("init_from_run_folder", "train.py", lambda tmp, s: [f"--init_from={s.checkpoint()}"],
     ["training run's folder", "--init_from=resume --out_dir="]),
    ("init_from_config_wrong_type", "train.py",
     lambda tmp, s: [f"--init_from={pretrained_with(tmp, s, n_layer='two')}"], ["config.json", "n_layer='two'", "int"]),
    ("init_from_config_not_json", "train.py",
     lambda tmp, s: [f"--init_from={folder_with(tmp, {'config.json': '{not json'})}"], ["config.json", "JSON"]),
    ("sample_init_from_empty_folder", "sample.py", lambda tmp, s: [f"--init_from={folder_with(tmp, {})}"],
     ["no config.json"]),
    ("sample_init_from_run_folder", "sample.py", lambda tmp, s: [f"--init_from={s.checkpoint()}"],
     ["training run's folder", "--init_from=resume --out_dir="]),
    ("sample_init_from_config_wrong_type", "sample.py",
     lambda tmp, s: [f"--init_from={pretrained_with(tmp, s, n_embd=32.5)}"], ["n_embd=32.5", "int"]),
    ("config_file_exits", "train.py", lambda tmp, s: [config_file(tmp, "exits.py", "raise SystemExit(0)\n")],
     ["exits.py", "line 1", "SystemExit(0)"]),
    ("config_file_exits_with_message", "train.py",
     lambda tmp, s: [config_file(tmp, "quits.py", "import sys\nsys.exit('bye')\n")], ["quits.py", "line 2"]),
    ("meta_unknown_tokenizer", "train.py",
     lambda tmp, s: [f"--data_dir={dataset_with_meta(tmp, tokenizer='foo', vocab_size=16)}"],
     ["meta.json", "unknown tokenizer 'foo'", "prepare.py"]),
    ("meta_itos_one_character", "train.py",
     lambda tmp, s: [f"--data_dir={dataset_with_meta(tmp, tokenizer='char', vocab_size=16, itos=['a'] * 16)}"],
     ["meta.json", "'a' more than once", "prepare.py"]),
    ("meta_itos_shorter_than_vocab", "train.py",
     lambda tmp, s: [f"--data_dir={dataset_with_meta(tmp, tokenizer='char', vocab_size=16, itos=ITOS[:8])}"],
     ["meta.json", "vocab_size says 16", "8 characters"]),
    ("meta_gpt2_other_vocab_size", "train.py",
     lambda tmp, s: [f"--data_dir={dataset_with_meta(tmp, tokenizer='gpt2', vocab_size=16)}"],
     ["meta.json", "50257", "16"]),
    ("meta_unknown_dtype", "train.py",
     lambda tmp, s: [f"--data_dir={dataset_with_meta(tmp, tokenizer='char', vocab_size=16, itos=ITOS, dtype='int8')}"],
     ["meta.json", "dtype 'int8'"]),
]
# numbers too large for a float (1e400 reads as inf), a lowered learning_rate whose schedule
# would climb to train.py's min_lr, an empty out_dir
CASES += [
    ("float_flag_beyond_range", "train.py", lambda tmp, s: ["--learning_rate=1e400"],
     ["learning_rate expects a finite number", "inf", "--learning_rate=1e400"]),
    ("config_file_nan", "train.py", lambda tmp, s: [config_file(tmp, "nan.py", "dropout = float('nan')\n")],
     ["dropout expects a finite number", "nan.py"]),
    ("sample_float_flag_beyond_range", "sample.py", lambda tmp, s: ["--temperature=-1e999"],
     ["temperature expects a finite number", "-inf"]),
    ("min_lr_above_learning_rate", "train.py", lambda tmp, s: ["--learning_rate=1e-5"],
     ["min_lr=6e-05 is above learning_rate=1e-05", "rise", "--min_lr"]),
    ("out_dir_empty", "train.py", lambda tmp, s: ["--out_dir="], ["out_dir is empty"]),
    ("dataset_empty", "train.py", lambda tmp, s: ["--dataset=", "--data_dir="], ["dataset is empty", "--data_dir"]),
    ("sample_prompt_file_is_a_folder", "sample.py", lambda tmp, s: [f"--out_dir={tmp}", f"--start=FILE:{tmp}"],
     ["is a folder (from start=FILE:", "name a text file"]),
    ("sample_checkpoint_not_torch", "sample.py", lambda tmp, s: [f"--out_dir={folder_with(tmp, {'ckpt.pt': 'hi'})}"],
     ["ckpt.pt is not a PyTorch checkpoint"]),
]
# settings of the right type that mean nothing: accepted before, and then silently never did anything
MEANINGLESS = [("checkpoint_interval", -5), ("sample_interval", -1), ("hellaswag_interval", -3),
               ("ckpt_every_tokens", -1), ("total_batch_size", -8), ("dist_timeout_minutes", 0),
               ("lr_decay_frac", 0.0), ("sample_max_tokens", 0), ("muon_lr", -0.1)]
CASES += [(f"{key}_meaningless", "train.py", lambda tmp, s, key=key, value=value: [f"--{key}={value}"],
           [f"{key}={value}", "makes no sense"]) for key, value in MEANINGLESS]


def run_case(case, tmp, shared):
    _, script, make_args, _ = case
    args = make_args(tmp, shared)
    if script == "train.py":
        args = TRAIN_BASE + [f"--data_dir={shared.data()}", f"--out_dir={os.path.join(tmp, 'out')}"] + args
    elif script == "sample.py":
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
    assert "weights_only" not in r.stderr, where  # torch's advice to load unsafely is never passed on


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


@pytest.mark.parametrize("launch", ["plain", "forked"])
def test_torchrun_user_error_is_one_line_from_rank_zero(tmp_path, launch):
    """Under torchrun every rank meets a bad setting: the line is printed once (rank 0), local rank 0 exits 2
    and torchrun's failure summary shows the line, for that one worker, instead of a pointer to its docs.
    torchrun itself exits 1 with its own ChildFailedError traceback: that is torchrun's, whatever its workers'
    status. The same with the workers forked from torchrun (docs/scaling.md), where torchrun's wrapper, not
    sys.excepthook, meets the worker's exception first."""
    shared = Shared(str(tmp_path))
    args = [*TRAIN_BASE, f"--data_dir={shared.data()}", f"--out_dir={tmp_path / 'out'}", "--dropout=1.5"]
    if launch == "plain":
        r = run_script("train.py", *args, nproc=2, check=False, timeout=240)
    else:
        r = subprocess.run([*FORKED_TORCHRUN, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = r.stdout + r.stderr
    line = "error: dropout=1.5 makes no sense: dropout must be at least 0 and below 1"
    printed = [x for x in out.splitlines() if re.sub(r"^\[rank\d\]: ", "", x).startswith("error:")]
    assert printed == [line], out[-3000:]  # once, and from no other rank
    assert r.returncode == 1, out[-3000:]  # torchrun's own status for any failed worker
    summary = out[out.index("Root Cause"):]
    assert "exitcode  : 2" in summary and f"traceback : {line}" in summary, summary
    # one failed worker in the summary, not one per process: the others wait for torchrun to stop them
    assert out.count("exitcode  :") == 1 and "<NO_OTHER_FAILURES>" in out, out[-3000:]
    assert 'File "' + os.path.join(ROOT, "train.py") not in out and 'File "train.py"' not in out  # none from train.py


@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:1"])
def test_a_gpu_in_a_worker_forked_after_cuda_started_is_one_line_naming_the_fix(monkeypatch, device):
    """A worker forked from a torchrun that started CUDA (counting the GPUs, unless NVML counts them) cannot use
    CUDA: one line naming PYTORCH_NVML_BASED_CUDA_CHECK=1, not torch's traceback later nor, for auto, the CPU."""
    from gpt.runtime import hardware
    from gpt.runtime.errors import UserError
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    with pytest.raises(UserError, match="set PYTORCH_NVML_BASED_CUDA_CHECK=1"):
        hardware.resolve_device(device)
    assert hardware.resolve_device("cpu") == "cpu"


FORKED_ENDS = """import atexit, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from gpt.runtime import errors
errors.install()
mark = lambda what: open(os.path.join(sys.argv[2], what + "-" + os.environ["RANK"]), "a").write("once")
errors.on_failure(lambda: mark("undone"))
atexit.register(lambda: mark("atexit"))
if sys.argv[3] == "bug":
    raise RuntimeError("a bug")
if sys.argv[3] == "ctrl-c":
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
"""


@pytest.mark.parametrize("end", ["bug", "ctrl-c", "clean", "clean, spawned"])
def test_a_worker_forked_from_torchrun_ends_as_a_worker_of_its_own(tmp_path, end):
    """A worker forked from torchrun is a copy of torchrun's process, run inside torchrun's wrappers: a bug still
    keeps its traceback (in torchrun's summary), Ctrl-C is still `interrupted (Ctrl-C)` and 130, what a script
    registered to undo on failure (train.py: out_dir as it found it) is undone, and its atexit functions
    (run.lock's removal) run at its end, once, as in a worker started as a new process. A worker that
    `--run-path` spawns (torchrun's default start method) ends with Python's own exit: its atexit runs once too."""
    script = tmp_path / "ends.py"
    script.write_text(FORKED_ENDS)
    launch = [*FORKED_TORCHRUN[:-1], "--start-method=spawn"] if end == "clean, spawned" else FORKED_TORCHRUN
    r = subprocess.run([*launch, str(script), ROOT, str(tmp_path), end], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    out, marks = r.stdout + r.stderr, {p.name: p.read_text() for p in tmp_path.glob("*-[01]")}
    if end.startswith("clean"):
        assert r.returncode == 0 and marks == {"atexit-0": "once", "atexit-1": "once"}, (marks, out[-3000:])
        assert "Exception ignored" not in out, out[-3000:]  # nothing of the worker's left to Python's teardown
        return
    # rank 0's marks (the other worker may be stopped before it ends)
    assert r.returncode == 1 and marks.get("undone-0") == marks.get("atexit-0") == "once", (marks, out[-3000:])
    if end == "bug":
        assert "RuntimeError: a bug" in out and 'ends.py", line 9' in out, out[-3000:]
    else:
        assert "interrupted (Ctrl-C)" in r.stderr and "exitcode  : 130" in out, out[-3000:]


def test_sample_into_a_closed_pipe_stops_quietly(tmp_path):
    """`python sample.py ... | head -1`: no BrokenPipeError traceback; status 141 (128 + SIGPIPE), as a shell
    reports any command its reader stopped early (cat, yes), which `set -o pipefail` still sees."""
    shared = Shared(str(tmp_path))
    cmd = (f"{sys.executable} sample.py {' '.join(SAMPLE_BASE)} --num_samples=50 --max_new_tokens=20 "
           f"--out_dir={shared.checkpoint()} | head -1; exit ${{PIPESTATUS[0]}}")
    # unbuffered: each sample is written at once, so the writes after head has gone find the pipe closed
    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 141, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr[-3000:]
    assert len(r.stdout.splitlines()) == 1


def test_wandb_without_key_is_refused_before_the_model_is_built(tmp_path):
    """wandb_log=True with no API key, login or offline mode: one line with the fix, before anything is built,
    and no prompt or network."""
    pytest.importorskip("wandb", reason="wandb is not installed here (pip install wandb)")
    shared = Shared(str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(tmp_path / "home"), WANDB_DIR=str(tmp_path / "wandb"),
               WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TRAIN_BASE, f"--data_dir={shared.data()}",
                        f"--out_dir={tmp_path / 'out'}", "--wandb_log=True"], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=180, env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: wandb_log=True") and "wandb login" in last and "WANDB_MODE=offline" in last
    assert "Initializing" not in r.stdout and not os.path.exists(tmp_path / "out" / "ckpt.pt")


def test_check_wandb_accepts_a_key_offline_mode_or_a_netrc_login(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed here (pip install wandb)")
    from gpt.monitor.trainlog import check_wandb
    from gpt.runtime.errors import UserError
    for k in [k for k in os.environ if k.startswith("WANDB_") or k == "NETRC"]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.ai")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="wandb login"):
        check_wandb()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb()
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    check_wandb()
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "y" * 40 + "\n")
    check_wandb()


def test_quickstart_config_works_from_any_folder(tmp_path):
    """config/quickstart.py reads config/train_shakespeare_char.py beside itself, not from the working
    directory: run from elsewhere, it gets as far as the data."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "quickstart.py"),
                        "--dataset=no_such_dataset", f"--out_dir={tmp_path / 'out'}"], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "wandb_project='shakespeare-char'" in r.stdout  # the file it reads beside itself was read
    assert "dataset 'no_such_dataset' not found" in r.stderr.strip().splitlines()[-1]
