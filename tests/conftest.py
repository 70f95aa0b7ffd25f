"""
What the tests share: the repository root, the subprocess runner for the scripts users type, a tiny model
configuration, dataset writers, and the data the tests need, made here: a generated play-like English corpus
(instead of tinyshakespeare) and GPT-2's BPE ranks, found locally or downloaded once.

A fresh clone needs nothing beside it. `../shared/data` (or $NANOGPT_SHARED_DATA) may hold gpt2.tiktoken, the
ranks file for offline machines; where OpenAI's download fails but PyPI answers (CI), the ranks come from
PyPI, in openai-whisper's source package, and are kept in ~/.cache/nanogpt-tests.
"""
import hashlib
import importlib.util
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile

import forkserver
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("NANOGPT_SHARED_DATA") or os.path.join(os.path.dirname(ROOT), "shared", "data")
sys.path.insert(0, ROOT)

# One OpenMP/MKL thread per torch process, this one (torch is imported after this file) and every script the
# tests start: two processes at once on CI's 2 cores (DDP ranks, test_errors' pool, pytest -n 2) each with
# threads that spin-wait for a core the other holds ran 5-12x slower than with one thread each.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
# two workers forked from torchrun, running the script in its interpreter (docs/scaling.md)
FORKED_TORCHRUN = [*TORCHRUN, "--nproc_per_node=2", "--run-path", "--start-method=fork"]

# Optional packages: the GPU machines have no datasets and no wandb, and pip cannot reach them there. A test
# that imports one, or runs a script that does, is marked @pytest.mark.needs("datasets") and skips, saying
# which is missing, where the package is not installed (tests/without/ fakes that on a machine that has it).


# CUDA-only tests are marked @pytest.mark.cuda: they skip without a CUDA GPU, and `pytest -m cuda` (the GPU
# check, dev/gpu_check.py) runs them alone.


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(*packages): skip, naming them, unless these packages are installed")
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skips without one); pytest -m cuda runs these")


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, which may run the script that needs it
def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") and not _cuda():
        pytest.skip("needs a CUDA GPU")
    for mark in item.iter_markers("needs"):
        missing = [name for name in mark.args if importlib.util.find_spec(name) is None]
        if missing:
            pytest.skip(f"needs {', '.join(missing)}, not installed here (pip install {' '.join(missing)})")


def _cuda():
    import torch
    return torch.cuda.is_available()


# Triton kernels (gpt/kernels/) run on the CPU under Triton's interpreter, in a fresh
# process (TRITON_INTERPRET=1 must be set before a kernel is defined). Triton comes with torch's CUDA builds: CI
# runs these tests under torch 2.11's; without Triton they skip.
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (torch's CUDA builds bring it; CI runs this under "
                                         "torch 2.11)")


def run_interpreted(code):
    """Runs code in a fresh Python under Triton's interpreter; it must exit 0 and print only "ok"."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-4000:]


def same_bf16_training(model, x, y, switch):
    """On the GPU, under bf16 autocast as training runs: the model's loss and gradients with config.<switch>
    False, then True, agree to bf16 rounding."""
    import torch
    results = []
    for on in (False, True):
        setattr(model.config, switch, on)
        model.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        results.append((loss.item(), [p.grad.float().clone() for p in model.parameters()]))
    (plain_loss, plain_grads), (on_loss, on_grads) = results
    assert abs(plain_loss - on_loss) < 1e-3 * plain_loss, (plain_loss, on_loss)
    for (name, _), a, b in zip(model.named_parameters(), plain_grads, on_grads):
        assert (a - b).norm() <= 2e-2 * a.norm() + 1e-6, name


def run(script, *args, check=True, nproc=1, env=None, cwd=ROOT, timeout=300, fresh=False):
    """Run a script (or `-c code`) of the repository as a user would: `python script args` in the repository,
    or torchrun with nproc processes. One thread per process (see above). check: it must exit 0 without a
    traceback. Returns the CompletedProcess (text stdout and stderr). A repository script, in one process or
    under torchrun for a run that must succeed (check), is forked from a process that has imported torch
    (tests/forkserver.py: the suite's time is mostly torch's import otherwise); fresh=True, or variables of its
    own in env (but forkserver.FORKABLE_VARIABLES), gets a new interpreter."""
    extra_env = env
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    if not fresh and forkserver.usable(script, nproc, extra_env, cwd, ROOT, check):
        hf = not extra_env and forkserver.reads_transformers(script, args, cwd)
        r = (forkserver.run([script, *args], cwd, env, timeout, preload=forkserver.TRANSFORMERS if hf else "")
             if nproc == 1 else
             forkserver.run_torchrun(script, args, nproc, cwd, env, timeout))
    else:
        launcher = [*TORCHRUN, f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
        r = subprocess.run([*launcher, str(script), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                           timeout=timeout, env=env)
    if check:
        what = " ".join(map(str, [script, *args]))
        assert r.returncode == 0, f"{what} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def flags(**kw):
    """--key=value command-line flags."""
    return [f"--{k}={v}" for k, v in kw.items()]


def tiny(**overrides):
    """The settings of a tiny GPT that trains in seconds on one CPU thread: float32, no dropout, no compile."""
    return dict(dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=1,
                     eval_interval=4, eval_iters=2, log_interval=1, warmup_iters=2, lr_decay_iters=12,
                     learning_rate=3e-3, dropout=0.0, compile=False, device="cpu", dtype="float32"), **overrides)


def declarations(script="train.py"):
    """A script's settings as its configurator declares them ({name: Setting}, in order): its imports, its
    annotated settings and its configurator call, run without the rest of the script (and without the
    command line: pytest's own arguments)."""
    import ast
    import types
    path = os.path.join(ROOT, script)
    with open(path) as f:
        tree = ast.parse(f.read())
    keep = [node for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.AnnAssign)) and not any(
                alias.name == "sys" for alias in getattr(node, "names", ()))
            or isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "config" for t in node.targets)]
    scope = dict(__file__=path, __name__="settings_of_" + script[:-3], sys=types.SimpleNamespace(argv=[script]))
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), scope)
    return scope["config"].declared


def train_settings():
    """train.py's settings with their defaults, as the configurator sees them: its own, and those declared
    with the model, Muon, DDP/FSDP2 and the dashboard."""
    return {name: s.default for name, s in declarations().items()}


def log_rows(out_dir, kind="train"):
    """The rows of one kind (train, eval, sample, ...) of a run's log.jsonl."""
    from gpt.monitor.trainlog import read_log
    return [row for row in read_log(out_dir) if row["kind"] == kind]


# ---- two trainings that differ only in the order of their float32 sums -------------------------------------

EPS32 = 2.0 ** -23  # float32's machine epsilon: twice the unit roundoff u of one rounded operation


def assert_same_training(a, b, terms, params):
    """Two float32 runs of the same training (log rows, step by step) that may sum in different orders - DDP's
    all-reduce, FSDP's reduce-scatter and sharded optimizer step, one process accumulating alone - agree to
    rounding, and no closer bound is assumed than rounding allows.

    The bound. Each gradient element is a sum of `terms` per-token contributions (batch_size * block_size *
    gradient_accumulation_steps over all ranks). Two orders of one sum of n terms each lie within
    γ_n ≈ n·u of the exact sum (Higham, Accuracy and Stability of Numerical Algorithms, §4.2), so they differ
    by at most n·EPS32 relative. AdamW divides each gradient by its running RMS and clipping by its norm, so
    an update carries its gradient's relative error; we let one step's allowance reach the loss whole and the
    allowances of successive steps add: |Δloss_t| ≤ (t + 1)·terms·EPS32·|loss_t|. This is a model, not a
    proof: a sum that cancels is off by more than n·u relative, and AdamW's eps turns such a near-zero
    gradient into a step of its own. The largest difference seen, in losses or weights, was 7.8e-5 (torch
    2.11 on an H100 machine's CPU; 1e-7 on CI's), 4x below the bound at step 1 and 14x at step 7 (the
    fixed 1e-5 these tests had missed it). The gradient norm (before clipping) adds a sum of `params` squares,
    all positive, so within (params / 2)·EPS32 relative.

    Which bugs it catches (measured with tiny(gradient_accumulation_steps=4), 8 steps, 2 ranks): gradients
    never averaged over the ranks (each steps on its own half batch) move the loss by 1.3e-3 at step 1 and
    6.4e-3 at step 7 (bounds 3.4e-4, 1.1e-3) and the step-0 gradient norm by 1% (bound 1.6e-3).
    Gradients summed instead of averaged leave every loss unchanged - AdamW and clipping do not see a
    gradient's scale - but double the gradient norm: a factor of 2, far above any rounding."""
    assert len(a) == len(b) and a, (len(a), len(b))
    for t, (x, y) in enumerate(zip(a, b)):
        assert x["step"] == y["step"] == t
        loss_bound = (t + 1) * terms * EPS32 * abs(y["loss"])
        assert abs(x["loss"] - y["loss"]) <= loss_bound, f"step {t}: loss {x['loss']} vs {y['loss']}, " \
                                                         f"more than rounding's {loss_bound:.2g} apart"
        norm_bound = ((t + 1) * terms + params / 2) * EPS32
        assert abs(x["grad_norm"] / y["grad_norm"] - 1) <= norm_bound, \
            f"step {t}: gradient norm {x['grad_norm']} vs {y['grad_norm']}, more than rounding's {norm_bound:.2g}"


# ---- data the tests make themselves ----------------------------------------------------------------------

# tinyshakespeare's 65 characters, so that a character-level dataset of the corpus has its vocabulary
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SPEAKERS = ["First Citizen", "Second Citizen", "All", "ROMEO", "JULIET", "MERCUTIO", "KING HENRY VI",
             "QUEEN ELIZABETH", "DUKE VINCENTIO", "LADY CAPULET", "GLOUCESTER", "BUCKINGHAM", "PETRUCHIO",
             "KATHARINA", "WARWICK", "YORK", "FRIAR LAURENCE", "Nurse", "Messenger", "ZOUNDS"]
_WORDS = dict(
    det="the a my thy his her our your this that no every".split(),
    adj="good noble sweet fair gentle poor proud old young dear true false brave cruel heavy quiet".split(),
    noun=("lord lady king queen heart love night day death life blood crown sword world time man woman son "
          "father mother friend grace hand eye head word news city people house honour fortune tongue "
          "soul heaven earth hour matter cause duty peace war corn citizen").split(),
    verb=("love hate speak hear know see bear give take kill fear keep make tell leave bring seek find "
          "call pray swear serve stay follow mark answer").split(),
    past="loved spoke heard knew saw bore gave took killed feared kept made told left brought sought".split(),
    adv="well now here there so still never ever too away again".split(),
    prep="of to in for with by from upon against within".split(),
    pron="I thou he she we you they".split(),
    interj="O Alas Nay Ay Come Well Peace Fie Good".split(),
    name="Romeo Juliet Caius Marcius Tybalt Edward Clarence Lucio Bianca Hastings Rivers Yorick".split(),
    odd="we'll o'er know't 'tis ne'er e'en well-met half-blown ha'".split(),
)
_SENTENCES = [
    "{det} {adj} {noun} {past} {det} {noun}.",
    "{pron} {verb} {det} {noun} {prep} {det} {adj} {noun}.",
    "{interj}, {name}! {pron} {verb} {det} {noun} {adv}.",
    "what {noun} is this, that {pron} {verb} {det} {noun}?",
    "{pron} {odd} {verb} {det} {noun}; {pron} {verb} {adv}.",
    "let us {verb} {det} {noun}, and {verb} {det} {adj} {noun}!",
    "{det} {noun} of {det} {noun} {past} {adv}: {adj} {noun}.",
    "{pron} will {verb} {det} {adj} {noun} {prep} {det} {noun}.",
]


def english_corpus(chars=300_000, seed=0):
    """A deterministic play in English-like verse, about `chars` characters: speakers' names in capitals, a
    colon, a few lines of grammatical sentences over a small vocabulary, a blank line. Learnable like
    tinyshakespeare (bigrams first, then words), with exactly its 65 characters."""
    rng = random.Random(seed)
    zipf = {k: [1 / (i + 1) for i in range(len(v))] for k, v in _WORDS.items()}

    def sentence():
        text = re.sub(r"\{(\w+)\}", lambda m: rng.choices(_WORDS[m[1]], zipf[m[1]])[0], rng.choice(_SENTENCES))
        return text[0].upper() + text[1:]

    parts = ["First Citizen:\nBefore we proceed any further, hear me speak.\n\n",
             "All:\nSpeak, speak.\n\n",
             # every character once, the rare ones included
             "JACK, QUIZ, WAXY BLOWFISH & VEX'D PYGMY:\nThe quick brown fox jumps over 3 lazy dogs; $ zero?\n\n"]
    size = sum(map(len, parts))
    while size < chars:
        lines, line = [], ""
        for _ in range(rng.randint(1, 6)):
            s = sentence()
            if line and len(line) + len(s) > 60:
                lines.append(line)
                line = s
            else:
                line = f"{line} {s}" if line else s
        lines.append(line)
        speech = f"{rng.choice(_SPEAKERS)}:\n" + "\n".join(lines) + "\n\n"
        parts.append(speech)
        size += len(speech)
    text = "".join(parts)
    assert set(text) == set(CHARS), set(text) ^ set(CHARS)
    return text


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory):
    """A text file of english_corpus(): the tests' tinyshakespeare."""
    path = tmp_path_factory.mktemp("corpus") / "input.txt"
    path.write_text(english_corpus(), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def shakespeare_text_path(corpus_path):
    """The generated corpus, under the name test_hf.py knows it by (it stands where tinyshakespeare did)."""
    return corpus_path


def _local_gpt2_ranks():
    """A GPT-2 BPE ranks file on this machine, without the network: $GPT2_TIKTOKEN_FILE, the shared data
    folder, or tiktoken's cache of r50k_base (the same ranks). Returns (path or None, the places looked)."""
    from_env = os.environ.get("GPT2_TIKTOKEN_FILE")
    cache = (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
             or os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    url = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
    places = ([from_env] if from_env else []) + [os.path.join(SHARED, "gpt2.tiktoken"),
                                                 os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()),
                                                 PYPI_RANKS]
    return next((p for p in places if os.path.isfile(p)), None), places


# openai-whisper's source package ships GPT-2's ranks as whisper/assets/gpt2.tiktoken: the same file, byte
# for byte, as OpenAI's (checked by its sha256), and PyPI is reachable where OpenAI's blob storage is not
PYPI_RANKS = os.path.join(os.path.expanduser("~"), ".cache", "nanogpt-tests", "gpt2.tiktoken")
WHISPER_SDIST = "openai-whisper==20250625"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def _gpt2_ranks_from_pypi():
    """Fetch the whisper source package with pip (no install), take its gpt2.tiktoken and keep it in
    PYPI_RANKS (written whole or not at all: test workers may race). Returns the path."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", d, WHISPER_SDIST], check=True, capture_output=True, timeout=300)
        (sdist,) = [os.path.join(d, f) for f in os.listdir(d)]
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken"))
            data = tar.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != GPT2_RANKS_SHA256:
        raise ValueError(f"{WHISPER_SDIST}'s gpt2.tiktoken is not GPT-2's ranks file")
    os.makedirs(os.path.dirname(PYPI_RANKS), exist_ok=True)
    tmp = f"{PYPI_RANKS}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, PYPI_RANKS)
    return PYPI_RANKS


# GPT-2 BPE offline: tiktoken cannot download its files here, so point the loader at a local ranks file
_ranks, _ = _local_gpt2_ranks()
if _ranks:
    os.environ["GPT2_TIKTOKEN_FILE"] = _ranks


@pytest.fixture(scope="session")
def gpt2_ranks_path(tmp_path_factory):
    """A GPT-2 BPE ranks file, also in $GPT2_TIKTOKEN_FILE for the scripts the tests start: found on this
    machine, else written from tiktoken's download, else fetched from PyPI. Skips only with no ranks file
    anywhere and neither network."""
    path, places = _local_gpt2_ranks()
    if path is None:
        import base64

        import tiktoken
        try:
            enc = tiktoken.get_encoding("gpt2")
            path = str(tmp_path_factory.mktemp("gpt2") / "gpt2.tiktoken")
            with open(path, "w") as f:
                f.writelines(f"{base64.b64encode(token).decode()} {rank}\n"
                             for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]))
        except Exception as e:
            try:
                path = _gpt2_ranks_from_pypi()
            except Exception as e2:
                pytest.skip(f"GPT-2 BPE: no ranks file found ({', '.join(places)}), tiktoken's download failed "
                            f"({type(e).__name__}) and so did PyPI's ({type(e2).__name__}: {e2}); set "
                            f"GPT2_TIKTOKEN_FILE to a gpt2.tiktoken file")
    os.environ["GPT2_TIKTOKEN_FILE"] = path
    return path


def write_char_dataset(folder, text_path, chars=100000, extra_chars=""):
    """A character-level dataset of the first `chars` characters of text_path in folder: meta.json, and
    train.bin / val.bin split 90/10, as data/shakespeare_char/prepare.py writes them. extra_chars join the
    vocabulary (for prompts or HellaSwag examples with characters the text lacks). Returns the folder."""
    from gpt.data.sources import write_meta, write_tokens
    from gpt.data.tokenizer import char_meta, get_tokenizer
    with open(text_path, encoding="utf-8") as f:
        text = f.read()[:chars]
    meta = char_meta(text + extra_chars)
    os.makedirs(folder, exist_ok=True)
    write_meta(folder, meta)
    ids = get_tokenizer(meta).encode(text)
    split = len(text) * 9 // 10
    write_tokens(os.path.join(folder, "train.bin"), ids[:split])
    write_tokens(os.path.join(folder, "val.bin"), ids[split:])
    return folder


def write_ids_dataset(folder, ids, itos, val=0.1, shards=False):
    """A dataset of given token ids over a character vocabulary itos, with meta.json: train.bin / val.bin,
    val the last `val` of the ids, as prepare.py splits; or with shards=True two llm.c shards,
    t_val_000000.bin the first `val` of the ids and t_train_000001.bin the rest, as fineweb's. Returns it."""
    import json

    import numpy as np

    from gpt.data.sources import write_shard
    os.makedirs(folder, exist_ok=True)
    ids = np.asarray(ids)
    n_val = int(len(ids) * val)
    meta = {"tokenizer": "char", "vocab_size": len(itos), "dtype": "uint16", "itos": list(itos)}
    if shards:
        write_shard(os.path.join(folder, "t_val_000000.bin"), ids[:n_val])
        write_shard(os.path.join(folder, "t_train_000001.bin"), ids[n_val:])
    else:
        ids.astype(np.uint16)[:len(ids) - n_val].tofile(os.path.join(folder, "train.bin"))
        ids.astype(np.uint16)[len(ids) - n_val:].tofile(os.path.join(folder, "val.bin"))
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f)
    return folder


def counting_ids(n, noise=0.1, stride=1, vocab=16, seed=0):
    """A learnable sequence of n ids: counting up through the vocabulary (by stride), with some noise."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return (np.arange(n) * stride + (rng.random(n) < noise) * rng.integers(0, vocab, n)) % vocab


@pytest.fixture
def one_thread():
    """One thread, as run() gives the scripts, for the models a test runs in its own process."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def extra_architecture_field(monkeypatch):
    """GPTConfig with one more architecture field, `test_extra: int = architecture(0)`, which the model itself
    ignores: model.GPTConfig, and the name GPTConfig in every module that imported it, become a subclass with
    that field for the test. Yields the field's name. Whatever reads the fields' kinds (resume, checkpoints,
    export) must treat it as any architecture field: a new field GPTConfig gains cannot be forgotten."""
    import dataclasses

    import model
    original = model.GPTConfig
    extended = dataclasses.make_dataclass("GPTConfig", [("test_extra", int, model.architecture(0))],
                                          bases=(original,))
    extended.__module__, extended.__qualname__ = original.__module__, original.__qualname__
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("GPTConfig") is original:  # no lazy module's __getattr__ runs
            monkeypatch.setattr(module, "GPTConfig", extended)
    yield "test_extra"
