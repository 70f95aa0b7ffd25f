"""
What a resumed run may change: each train.py setting declares it (gpt/runtime/settings.py: RUN, TRAINING, kept,
and the model's fields by their kind on GPTConfig). From the declarations, a resume with each setting changed:
a refused one is one error line; a training one changes the next steps (their learning rate, loss or gradient
norm), so the value the plan records is the one that trains, never one a checkpoint's optimizer state
silently overrules.

train.py runs in this process (runpy), so its imports are paid once: a resume of a tiny model is a fraction of
a second, and the table's ~30 cases take seconds.
"""
import contextlib
import io
import runpy
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, declarations, flags, log_rows, tiny, train_settings, write_ids_dataset

from gpt.runtime import errors
from gpt.runtime.settings import MODEL, RUN, TRAINING, resume_groups
from model import ARCHITECTURE, INITIALISATION, GPTConfig

GROUPS = resume_groups(declarations())

START, STEPS = 4, 2  # the first run saves at step 4; each resume trains steps 4 and 5
BASE = tiny(n_layer=1, block_size=16, warmup_iters=2, lr_decay_iters=8, max_iters=START, eval_interval=START,
            eval_iters=1, min_lr=3e-4, grad_clip=1.0, weight_decay=0.1, beta2=0.95)


def train(*args):
    """train.py with these flags, in this process; returns its stdout. The signal handlers and failure
    callbacks it installs are put back."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    argv, hook, out = sys.argv, sys.excepthook, io.StringIO()
    sys.argv = ["train.py", *args]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(f"{ROOT}/train.py", run_name="__main__")
    finally:
        sys.argv, sys.excepthook = argv, hook
        errors._failure_callbacks.clear()
        for s, h in handlers.items():
            signal.signal(s, h)
    return out.getvalue()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(0)
    return [write_ids_dataset(tmp / name, rng.integers(0, 16, 3000), "abcdefghijklmnop", val=0.2)
            for name in ("data", "other")]


@pytest.fixture(scope="module", params=["adamw", "muon"])
def first_run(request, datasets, tmp_path_factory):
    """A run trained START steps with AdamW or Muon, its checkpoint at step START, and the flags that made it."""
    out = tmp_path_factory.mktemp(f"first-{request.param}")
    given = flags(**BASE, data_dir=datasets[0], optimizer=request.param)
    train(*given, f"--out_dir={out}")
    return out, given


def resume(first_run, tmp_path, *changed):
    """The first run resumed for STEPS steps in a copy of its out_dir, with the changed flags; returns the train
    rows of those steps as (step, lr, loss, grad_norm)."""
    out, given = first_run
    copy = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    shutil.copytree(out, copy)
    train(*given, f"--out_dir={copy}", "--init_from=resume", f"--max_iters={START + STEPS}", *changed)
    return [(r["step"], r["lr"], r["loss"], r["grad_norm"]) for r in log_rows(copy) if r["step"] >= START]


# a changed value for each training setting, where doubling or halving it would not do, and what it needs
# around it (the same in the unchanged resume it is compared with)
CHANGED = {
    'decay_lr': ["--decay_lr=False"],
    'lr_schedule': ["--lr_schedule=constant"],
    'lr_decay_frac': ["--lr_decay_frac=0.6"],
    'warmup_iters': ["--warmup_iters=3"],
    'warmup_tokens': ["--warmup_iters=0", "--warmup_tokens=200"],
    'lr_decay_tokens': ["--lr_decay_iters=0", "--lr_decay_tokens=2000"],
    'max_iters': [f"--max_iters={START + STEPS + 4}"],
    'max_tokens': ["--max_iters=0", f"--max_tokens={(START + STEPS + 4) * 64}"],
    'total_batch_size': ["--total_batch_size=128"],
    'dataset': None,  # a name under data/: its folder is data_dir's, changed below
    'dtype': ["--dtype=bfloat16"],
    'dropout': ["--dropout=0.3"],
    'grad_clip': ["--grad_clip=0.05"],
    'muon_weight_decay': ["--muon_weight_decay=0.5"],
    'muon_nesterov': ["--muon_nesterov=False"],
}
CONTEXT = {'lr_decay_frac': ["--lr_schedule=wsd"], 'max_iters': ["--lr_schedule=wsd"],
           'max_tokens': ["--lr_schedule=wsd"]}


def changed_flags(key, datasets):
    """The flags that change `key` from the first run's value: halved (an int: one more), or CHANGED's."""
    if key == 'data_dir':
        return [f"--data_dir={datasets[1]}"]
    if key in CHANGED:
        return CHANGED[key]
    value = {**train_settings(), **BASE}[key]
    assert type(value) in (int, float), f"{key}: say in CHANGED how to change it"
    assert value, f"{key}: say in CHANGED how to change it"
    return [f"--{key}={value + 1 if type(value) is int else value / 2}"]


@pytest.mark.parametrize("key", GROUPS[TRAINING])
def test_a_resume_that_changes_a_training_setting_trains_with_it(first_run, datasets, tmp_path, key):
    if CHANGED.get(key, ()) is None:
        pytest.skip("dataset names a folder under data/; data_dir, the same setting as a path, is changed instead")
    if key.startswith('muon_') and "--optimizer=muon" not in first_run[1]:
        pytest.skip("a Muon setting: tried on the Muon run")
    context = CONTEXT.get(key, [])
    same, other = resume(first_run, tmp_path, *context), resume(first_run, tmp_path, *context,
                                                                 *changed_flags(key, datasets))
    assert len(same) == STEPS and other[0][0] == START, (key, same, other)
    assert same != other[:STEPS], f"{key}: the resumed steps did not change: {same}"


@pytest.mark.parametrize("key", [*GROUPS['kept'], 'n_layer', 'zero_init_proj'])
def test_a_resume_that_changes_a_refused_setting_is_one_error_line(first_run, tmp_path, key):
    value = {'optimizer': 'sgd' if "--optimizer=muon" in first_run[1] else 'muon', 'seed': 7, 'n_layer': 3,
             'zero_init_proj': True, 'scalar_lr': 0.04}[key]
    with pytest.raises(errors.UserError, match=f"{key}={value!r}"):
        resume(first_run, tmp_path, f"--{key}={value}")


def test_every_setting_declares_what_a_resume_does_with_it():
    groups = [set(GROUPS[RUN]), set(GROUPS[TRAINING]), set(GROUPS[MODEL]), set(GROUPS['kept'])]
    assert sum(map(len, groups)) == len(set().union(*groups)) == len(train_settings())  # each in one group
    # the model's own fields are kept as their kind on GPTConfig says: architecture and initialisation
    model_kept = set(GPTConfig.fields_of(ARCHITECTURE)) | set(GPTConfig.fields_of(INITIALISATION))
    assert set(GROUPS[MODEL]) == model_kept & set(train_settings())
    assert {'optimizer', 'seed', 'scalar_lr'} <= set(GROUPS['kept']) and 'learning_rate' in GROUPS[TRAINING]


def test_a_checkpoint_without_optimizer_state_resumes_saying_so(first_run, tmp_path):
    import torch
    out = tmp_path / "weights-only"
    shutil.copytree(first_run[0], out)
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    del ckpt["optimizer"]
    torch.save(ckpt, out / "ckpt.pt")
    stdout = train(*first_run[1], f"--out_dir={out}", "--init_from=resume", f"--max_iters={START + 1}")
    assert "holds weights without optimizer state" in stdout and "moments start afresh" in stdout


def test_of_two_checkpoints_the_newest_wins_or_the_run_is_refused_naming_both(first_run, tmp_path):
    """A sharded checkpoint newer than ckpt.pt: ddp cannot read it, so it is refused, naming both (sample.py and
    export too), rather than resumed from the older ckpt.pt."""
    import torch

    from gpt import checkpoint
    out = tmp_path / "both"
    shutil.copytree(first_run[0], out)
    (out / checkpoint.DCP_DIR).mkdir()
    torch.save({"iter_num": START + 5}, out / checkpoint.DCP_DIR / checkpoint.TRAIN_STATE)
    with pytest.raises(errors.UserError, match=r"newest checkpoint is the sharded .*ckpt_dcp.*convert_checkpoint"):
        train(*first_run[1], f"--out_dir={out}", "--init_from=resume", f"--max_iters={START + 1}")
    with pytest.raises(errors.UserError, match=r"ckpt_dcp .*is newer than .*ckpt.pt"):
        checkpoint.load_model("resume", str(out))
    if "--optimizer=muon" in first_run[1]:
        return  # export.py's refusal once is enough (a subprocess: seconds)
    r = subprocess.run([sys.executable, "export.py", f"--out_dir={out}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {out}'s newest checkpoint is the sharded (fsdp) {out / 'ckpt_dcp'}: make a ckpt.pt of it first "
        f"with `python convert_checkpoint.py --out_dir={out}`"], r.stderr
    (out / "ckpt.pt").touch()  # ckpt.pt the newer: it is the run's state
    assert checkpoint.load_for_resume(str(out), "ddp")["iter_num"] == START


@pytest.mark.parametrize("flag, refused", [("--parallelism=foo", "unknown parallelism 'foo'"),
                                           ("--optimizer=sgd", "unknown optimizer 'sgd'"),
                                           ("--compile_scope=layers", "compile_scope='layers'"),
                                           ("--sample_interval=2 --sample_prompt=XYZ", "sample_prompt='XYZ'")])
def test_a_run_the_plan_refuses_touches_nothing(datasets, tmp_path, flag, refused):
    out = tmp_path / "new"
    with pytest.raises(errors.UserError, match=refused):
        train(*flags(**BASE, data_dir=datasets[0], out_dir=out), *flag.split())
    assert not out.exists()


def test_the_plan_records_what_runs_not_what_was_asked(datasets, tmp_path):
    """cuda_graph=True on a CPU is off, and the plan, the log and the checkpoint say so."""
    import torch
    out = tmp_path / "asked"
    stdout = train(*flags(**{**BASE, "max_iters": 1}, data_dir=datasets[0], out_dir=out, cuda_graph=True))
    assert "cuda_graph: off (needs a CUDA GPU, not cpu)" in stdout
    row = log_rows(out, "plan")[0]
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    assert row["cuda_graph"] is False and row["settings"]["cuda_graph"] is False
    assert ckpt["config"]["cuda_graph"] is False and ckpt["plan"]["cuda_graph"] is False
    assert row["optimizer"]["name"] == "adamw" and row["optimizer"]["betas"] == [0.9, 0.95]


def test_model_args_that_do_not_fit_the_weights_are_refused_before_building(first_run, tmp_path):
    """A damaged n_embd would ask for a model of tens of GB: the shapes are compared first (on the meta device)."""
    import torch

    from gpt.checkpoint import load_model
    out = tmp_path / "damaged"
    shutil.copytree(first_run[0], out)
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    ckpt["model_args"]["n_embd"] = 2**16
    torch.save(ckpt, out / "ckpt.pt")
    given = [f for f in first_run[1] if not f.startswith("--n_embd=")]  # else that difference is named first
    for attempt in (lambda: train(*given, f"--out_dir={out}", "--init_from=resume"),
                    lambda: load_model("resume", str(out))):
        with pytest.raises(errors.UserError, match=r"weights do not fit the model its model_args describe: "
                                                   r"transformer.wte.weight \[17, 32\] \(model_args: \[17, 65536\]\)"):
            attempt()
