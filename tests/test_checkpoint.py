"""
Never lose a run: exact resume (one process and DDP), preemption by signal, kill -9 during saves,
failed saves, non-finite losses, and files that must not run code.
"""
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import ROOT, counting_ids, log_rows, run, tiny, write_ids_dataset

from gpt.checkpoint import Saver, load_checkpoint, rundir, write_checkpoint
from gpt.data import read_meta
from gpt.runtime.errors import UserError

# dropout on, so resuming must restore the random state too, not just weights and optimizer
TINY = tiny(gradient_accumulation_steps=2, eval_interval=5, warmup_iters=3, lr_decay_iters=20, dropout=0.1,
            dataset="tiny")


def flags(**kw):
    return [f"--{k}={v}" for k, v in {**TINY, **kw}.items()]


def train(data_dir, out_dir, *args, ddp=False, check=True):
    return run("train.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args, nproc=2 if ddp else 1,
               check=check)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_ids_dataset(tmp_path_factory.mktemp("data"), counting_ids(30000, noise=0.2), "abcdefghijklmnop")


@pytest.mark.parametrize("ddp, async_save", [(False, False), (True, False), (True, True)],
                         ids=["one-process", "ddp-gloo", "ddp-gloo-async-save"])
def test_resume_continues_exactly(data_dir, tmp_path, ddp, async_save):
    """async_save: the halves' checkpoints are written from a thread while the steps go on; the whole run's not."""
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(data_dir, whole, *flags(max_iters=20), ddp=ddp)
    train(data_dir, halves, *flags(max_iters=10, async_save=async_save), ddp=ddp)
    train(data_dir, halves, *flags(max_iters=20, init_from="resume", async_save=async_save), ddp=ddp)
    a, b = log_rows(whole), log_rows(halves)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(20))  # the log has no repeats
    # bitwise: the same batches, learning rates, dropout masks and optimizer state
    assert [(r["loss"], r["lr"], r["grad_norm"]) for r in a] == [(r["loss"], r["lr"], r["grad_norm"]) for r in b]
    wa = torch.load(whole / "ckpt.pt", weights_only=True)
    wb = torch.load(halves / "ckpt.pt", weights_only=True)
    assert wa["iter_num"] == wb["iter_num"] == 20
    for k in wa["model"]:
        assert torch.equal(wa["model"][k], wb["model"][k]), k
    if ddp:
        assert len(wa["rng"]) == 2  # each rank's random state is kept


def test_resume_drops_log_rows_written_after_the_checkpoint(data_dir, tmp_path):
    out = tmp_path / "out"
    train(data_dir, out, *flags(max_iters=10))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    with open(out / "log.jsonl", "a") as f:  # as if the run had gone on past its checkpoint, then crashed
        f.write(json.dumps({"kind": "train", "step": 10, "loss": 9.9}) + "\n")
    assert os.path.getsize(out / "log.jsonl") > ckpt["log_position"]
    r = train(data_dir, out, *flags(max_iters=12, init_from="resume"))
    assert "dropped 2 rows" in r.stdout  # the row above, and the first run's "end" row
    assert [row["step"] for row in log_rows(out)] == list(range(12))


def train_rows(out_dir):
    """How many training steps a run's log.jsonl holds (its plan and eval rows aside)."""
    path = os.path.join(out_dir, "log.jsonl")
    return sum('"kind": "train"' in line for line in open(path)) if os.path.exists(path) else 0


def wait_for_rows(out_dir, n, proc, timeout=120):
    """Until the live run has logged n training steps."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if train_rows(out_dir) >= n:
            return
        time.sleep(0.2)
    raise AssertionError("training did not log in time")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_step_saves_and_says_how_to_resume(data_dir, tmp_path, sig):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out}",
                             *flags(max_iters=100000, eval_interval=100000)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out, 6, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr[-2000:]
    assert "Traceback" not in stderr
    stopped = [line for line in stdout.splitlines() if line.startswith("stopped at iteration")]
    assert len(stopped) == 1 and "--init_from=resume" in stopped[0], stdout[-2000:]
    n = int(stopped[0].split()[3].rstrip(";"))
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["iter_num"] == n and n >= 6  # no eval happened: the checkpoint is the signal's
    train(data_dir, out, *flags(max_iters=n + 3, eval_interval=100000, init_from="resume"))
    assert [row["step"] for row in log_rows(out)] == list(range(n + 3))  # rows n.. are the resumed run's


@pytest.mark.parametrize("async_save", [False, True])
def test_a_stop_keeps_the_best_weights_where_the_summary_says(data_dir, tmp_path, async_save):
    """always_save_checkpoint=False: ckpt.pt holds the best val loss's weights. A stop's save (a later step)
    keeps them as ckpt-best.pt first, and the summary and the log's end row say which file holds what, with the
    command that resumes; a resumed run keeps saying so, or, past a new best, drops the stale copy."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out}",
                             *flags(max_iters=100000, always_save_checkpoint=False, learning_rate=1e-2,
                                    async_save=async_save)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out, 8, proc)  # evaluations at steps 0 and 5: the second is a new best, saved to ckpt.pt
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr[-2000:]
    (end,) = log_rows(out, "end")
    best, last = load_checkpoint(str(out / "ckpt-best.pt")), load_checkpoint(str(out / "ckpt.pt"))
    assert end["best_checkpoint"] == str(out / "ckpt-best.pt") and end["best_step"] == best["iter_num"] >= 5
    assert end["checkpoint"] == str(out / "ckpt.pt") and end["checkpoint_step"] == last["iter_num"] > best["iter_num"]
    assert best["best_val_loss"] == end["best_val_loss"]  # the weights the best val loss was measured on
    assert f"(step {best['iter_num']}, its weights in {out / 'ckpt-best.pt'}), checkpoint {out / 'ckpt.pt'} " \
           f"(step {last['iter_num']})" in stdout, stdout[-2000:]
    assert "--init_from=resume" in end["next_command"]
    train(data_dir, out, *flags(max_iters=last["iter_num"] + 6, always_save_checkpoint=False, init_from="resume"))
    end = log_rows(out, "end")[-1]
    if end["best_checkpoint"] == str(out / "ckpt.pt"):  # a new best: ckpt.pt holds it, no stale copy stays
        assert not (out / "ckpt-best.pt").exists() and end["best_step"] == load_checkpoint(str(out / "ckpt.pt"))[
            "iter_num"]
    else:
        assert end["best_checkpoint"] == str(out / "ckpt-best.pt") and end["best_step"] == best["iter_num"]


def test_second_signal_exits_at_once(tmp_path):
    script = ("import os, signal, sys, time\nsys.path.insert(0, %r)\nfrom gpt.runtime.signals import StopRequest\n"
              "stop = StopRequest()\nos.kill(os.getpid(), signal.SIGTERM)\nprint('first handled:', stop.requested())\n"
              "sys.stdout.flush()\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(30)\nprint('not reached')\n" % ROOT)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 20
    assert r.returncode == 128 + signal.SIGTERM
    assert "first handled: True" in r.stdout and "not reached" not in r.stdout
    assert "exiting now, without a checkpoint" in r.stderr


def test_kill_9_during_saves_never_breaks_the_checkpoint(data_dir, tmp_path):
    out = tmp_path / "out"
    rnd = random.Random(0)
    # a checkpoint every step, killed at random moments, again and again
    args = flags(max_iters=100000, eval_interval=1, eval_iters=1)
    for _ in range(4):
        resume = ["--init_from=resume"] if (out / "ckpt.pt").exists() else []
        proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out}", *args,
                                 *resume], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_rows(out, train_rows(out) + 2, proc)  # past a save or two (a checkpoint every step)
        time.sleep(rnd.uniform(0.0, 1.0))
        proc.kill()
        proc.wait()
        ckpt = load_checkpoint(str(out / "ckpt.pt"))  # always a whole, loadable file
        assert ckpt["iter_num"] > 0
    last = load_checkpoint(str(out / "ckpt.pt"))["iter_num"]
    train(data_dir, out, *flags(max_iters=last + 2, eval_interval=1, eval_iters=1, init_from="resume"))
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == last + 2
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]  # leftovers of killed saves are cleaned


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "ckpt.pt")
    assert write_checkpoint({"model": {"w": torch.ones(3)}, "model_args": {}, "iter_num": 1}, path) is None

    def disk_full(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", disk_full)
    assert write_checkpoint({"model": {"w": torch.zeros(3)}, "model_args": {}, "iter_num": 2}, path)
    assert "No space left on device" in capsys.readouterr().out
    monkeypatch.undo()
    ckpt = load_checkpoint(path)
    assert ckpt["iter_num"] == 1 and torch.equal(ckpt["model"]["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def tied_model_and_optimizer(device="cpu"):
    """Two linear layers sharing one weight (as wte and lm_head do), and AdamW with moments after one step."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4)}).to(device)
    model["b"].weight = model["a"].weight
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.ones(2, 4, device=device)
    return model, opt, lambda: (model["b"](model["a"](x)).square().sum().backward(), opt.step())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_background_save_holds_its_steps_weights_while_the_next_step_changes_them(tmp_path, monkeypatch, device):
    """async_save: the steps after a save change the weights and AdamW's moments in place while the thread is still
    writing; the file holds those of the saved step, the tied weights still one tensor. The second save writes
    its copy over the first's."""
    model, opt, train_step = tied_model_and_optimizer(device)
    go, real_save = threading.Event(), torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: (go.wait(30), real_save(*a, **k)))
    saver = Saver(str(tmp_path), background=True)
    for step in (3, 4):
        train_step()
        go.clear()
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        moment = opt.state[model["a"].weight]["exp_avg"].clone()
        assert saver.save(model, opt, iter_num=step, model_args={}) is True
        train_step()  # in place, as the writer waits
        assert not torch.equal(model["a"].weight, weights["a.weight"])
        go.set()
        assert saver.wait() is True and saver.good == (str(tmp_path / "ckpt.pt"), step)
        ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        assert all(torch.equal(ckpt["model"][k], w.cpu()) for k, w in weights.items()) and ckpt["iter_num"] == step
        assert ckpt["model"]["a.weight"].untyped_storage().data_ptr() == ckpt["model"]["b.weight"].untyped_storage(
        ).data_ptr()
        assert torch.equal(ckpt["optimizer"]["state"][0]["exp_avg"], moment.cpu())


def test_a_background_save_that_fails_is_said_and_ends_the_run_in_error(tmp_path, monkeypatch, capsys):
    """A write that fails in the thread says so in one line as a failed save does, keeps the previous file, and
    the run ends with the error that names it and the last good checkpoint."""
    model, opt, train_step = tied_model_and_optimizer()
    saver = Saver(str(tmp_path), background=True)
    saver.save(model, opt, iter_num=1, model_args={})
    train_step()
    assert saver.wait() is True  # written before torch.save breaks below

    def disk_full(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", disk_full)
    assert saver.save(model, opt, iter_num=2, model_args={}) is True  # being written
    assert saver.wait() is False
    assert "error: could not save checkpoint" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"last checkpoint could not be saved .*No space left on device.*the last good "
                                        r"checkpoint is .*ckpt.pt, from step 1"):
        saver.check_end()
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter_num"] == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


def test_async_save_writes_the_files_a_run_in_the_step_writes(data_dir, tmp_path):
    """async_save changes when a checkpoint is written, not what: the same files (ckpt.pt, the numbered copies, the
    token checkpoints), each with the same weights, optimizer state, step and record of the best."""
    runs = {}
    for async_save in (False, True):
        out = tmp_path / str(async_save)
        train(data_dir, out, *flags(max_iters=20, keep_checkpoints=2, ckpt_every_tokens=500,
                                    always_save_checkpoint=False, async_save=async_save))
        runs[async_save] = {f: torch.load(out / f, weights_only=True) for f in sorted(os.listdir(out))
                            if f.endswith(".pt")}
    assert list(runs[False]) == list(runs[True]) and len(runs[True]) >= 4, list(runs[True])
    for name, a in runs[False].items():
        b = runs[True][name]
        assert (a["iter_num"], a["best_checkpoint"]) == (b["iter_num"], b["best_checkpoint"]), name
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), name
        assert all(torch.equal(x, b["optimizer"]["state"][i][key]) for i, state in a["optimizer"]["state"].items()
                   for key, x in state.items()), name


def test_keep_checkpoints(data_dir, tmp_path):
    out = tmp_path / "out"
    train(data_dir, out, *flags(max_iters=20, keep_checkpoints=2))
    assert sorted(f for f in os.listdir(out) if f.endswith(".pt")) == ["ckpt-0000015.pt", "ckpt-0000020.pt", "ckpt.pt"]
    assert load_checkpoint(str(out / "ckpt-0000015.pt"))["iter_num"] == 15


def test_numbered_copies_are_kept_by_step_past_ten_million(tmp_path):
    """Past step 9,999,999 the copies' names grow a digit: the oldest is the lowest step, not the first name."""
    from gpt.checkpoint import keep_numbered_copy
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    for step in (9_999_998, 9_999_999, 10_000_000):
        keep_numbered_copy(str(tmp_path / "ckpt.pt"), step, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-10000000.pt", "ckpt-9999999.pt", "ckpt.pt"]


NAN_WRAPPER = '''
import runpy, sys
sys.path.insert(0, {root!r})
import model
bad, calls, forward = {bad}, [0], model.GPT.forward
def poisoned(self, idx, targets=None, **kw):
    logits, loss = forward(self, idx, targets, **kw)
    if targets is not None and self.training:
        calls[0] += 1
        if calls[0] in bad or -1 in bad:
            loss = loss * float("nan")
    return logits, loss
model.GPT.forward = poisoned
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path({root!r} + "/train.py", run_name="__main__")
'''


def run_poisoned(data_dir, out, bad, *args, tmp_path):
    wrapper = tmp_path / "poisoned_train.py"
    wrapper.write_text(NAN_WRAPPER.format(root=ROOT, bad=bad))
    return run(wrapper, f"--data_dir={data_dir}", f"--out_dir={out}", *args, check=False)


def test_nonfinite_steps_are_skipped_and_counted(data_dir, tmp_path):
    out = tmp_path / "out"
    # forward calls 7 and 8 are micro-steps of iteration 3: that update alone is skipped
    r = run_poisoned(data_dir, out, {7, 8}, *flags(max_iters=10), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "iter 3: non-finite gradient norm, update skipped (1 in a row)" in r.stdout
    rows = log_rows(out)
    assert rows[3]["grad_norm"] is None and rows[-1]["skipped_steps"] == 1
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert ckpt["skipped_steps"] == 1


def test_nonfinite_run_stops_with_clear_message_and_keeps_last_good_checkpoint(data_dir, tmp_path):
    out = tmp_path / "out"
    train(data_dir, out, *flags(max_iters=5))
    r = run_poisoned(data_dir, out, {-1}, *flags(max_iters=30, init_from="resume", max_nonfinite_steps=3),
                     tmp_path=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: stopping: 3 steps in a row had a non-finite loss or gradient"), r.stderr[-2000:]
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["iter_num"] == 5 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_checkpoint_whose_weights_do_not_fit_its_shape(data_dir, tmp_path):
    out = tmp_path / "out"
    train(data_dir, out, *flags(max_iters=5))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model_args"]["n_embd"] = 64
    torch.save(ckpt, out / "ckpt.pt")
    for script in ("train.py", "sample.py"):
        args = [f"--out_dir={out}", "--device=cpu"]
        if script == "train.py":
            args += [f"--data_dir={data_dir}", "--init_from=resume"]
        r = run(script, *args, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error:") and "ckpt.pt" in last and "do not fit" in last, last


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_files_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": {0: "a"}, "x": _Exploit(marker)}, f)
    with pytest.raises(UserError, match="meta.pkl"):
        read_meta(str(tmp_path))
    torch.save({"model": {}, "model_args": {}, "x": _Exploit(marker)}, tmp_path / "ckpt.pt")
    with pytest.raises(UserError, match="ckpt.pt"):
        load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert not marker.exists()
    # nanoGPT's own meta.pkl (plain data) still reads
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 0, "b": 1}}, f)
    assert read_meta(str(tmp_path))["itos"] == ["a", "b"]


def test_a_file_that_is_no_checkpoint_is_one_line(tmp_path):
    """Any file given as a checkpoint: torch.load reads whatever is not a zip as a legacy pickle, and fails
    with whatever that decoding meets (KeyError: 101 for a text file starting with 'h')."""
    import numpy as np
    not_torch = {"text.pt": b"hello, not a checkpoint", "random.pt": bytes(random.Random(0).randbytes(4096))}
    for name, data in not_torch.items():
        (tmp_path / name).write_bytes(data)
    np.save(tmp_path / "array.npy", np.arange(10))
    for name in [*not_torch, "array.npy"]:
        with pytest.raises(UserError, match=f"{name} is not a PyTorch checkpoint .neither torch.save's zip "
                                            f"format nor its legacy one."):
            load_checkpoint(str(tmp_path / name))
    # torch.save's legacy format still loads; cut short, or empty, it is a damaged checkpoint
    torch.save({"model": {}, "model_args": {}}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert load_checkpoint(str(tmp_path / "legacy.pt"))["model_args"] == {}
    (tmp_path / "cut.pt").write_bytes((tmp_path / "legacy.pt").read_bytes()[:40])
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("cut.pt", "empty.pt"):
        with pytest.raises(UserError, match=f"{name} is not a readable checkpoint .truncated or corrupted.: EOFError"):
            load_checkpoint(str(tmp_path / name))


def test_no_checkpoint_names_the_earlier_runs_kept_aside(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", check=False)
    assert r.returncode == 2 and r.stderr.strip() == f"error: no checkpoint at {out / 'ckpt.pt'}: train one first, " \
                                                     f"or point out_dir at the folder holding ckpt.pt"
    for name in ("earlier-20260101-120000", "earlier-20260101-120000-2", "earlier-20251231-235959",
                 "earlier-20260102-080000"):  # the last has no checkpoint (a log alone): not named
        (out / name).mkdir()
        (out / name / ("log.jsonl" if name.endswith("080000") else "ckpt.pt")).write_text("x")
    r = run("sample.py", f"--out_dir={out}", "--device=cpu", check=False)
    newest = out / "earlier-20260101-120000-2"
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: no checkpoint at {out / 'ckpt.pt'}: an earlier run's checkpoint is kept in {newest} (older ones: "
        f"{out / 'earlier-20260101-120000'}, {out / 'earlier-20251231-235959'}): use --out_dir={newest}, or move "
        f"its files back"), r.stderr


def test_a_live_run_stops_rather_than_save_into_a_folder_another_run_claimed(data_dir, tmp_path):
    """If a second run claimed out_dir anyway (its run.lock in place of this run's: a folder lock is not
    to be had on every file system), the live run's next save refuses, in one line naming that run."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out}",
                             *flags(max_iters=100000, eval_interval=100000, checkpoint_interval=3)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out, 4, proc)
    proc.send_signal(signal.SIGSTOP)  # the other run's two writes happen together, as far as this run can tell
    os.remove(out / "run.lock")
    (out / "run.lock").write_text("PID 4242 on host elsewhere, since 2026-01-01T00:00:00, run abc\n")
    (out / "ckpt.pt").write_bytes(b"the other run's")
    proc.send_signal(signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert stderr.strip().startswith(f"error: not saving to {out}: another run has claimed {out} (PID 4242 on "
                                     f"host elsewhere, since 2026-01-01T00:00:00, run abc); this run stops") \
        and stderr.count("\n") == 1, stderr
    assert (out / "ckpt.pt").read_bytes() == b"the other run's" and (out / "run.lock").exists()


@pytest.mark.parametrize("background", [False, True])
def test_a_folder_claimed_while_the_checkpoint_is_written_is_not_written_over(tmp_path, monkeypatch, background):
    """Writing a checkpoint takes seconds: the folder is checked again just before the new file takes the old
    one's place, so another run that claimed it meanwhile keeps its checkpoint, and no temporary file is left.
    Written in the background (async_save), the error stops the run at the next save, or as the run ends."""
    out = tmp_path / "out"
    claim = rundir.claim(str(out), fresh=True)
    saver = Saver(str(out), claim=claim, background=background)
    model = torch.nn.Linear(2, 2)
    real_save = torch.save

    def save_while_another_run_claims(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        os.remove(out / "run.lock")
        (out / "run.lock").write_text("PID 4242 on host elsewhere, since 2026-01-01T00:00:00, run abc\n")
        (out / "ckpt.pt").write_bytes(b"the other run's")

    monkeypatch.setattr(torch, "save", save_while_another_run_claims)
    with pytest.raises(UserError, match=rf"not saving to {out}: another run has claimed {out} \(PID 4242.*"
                                        rf"ckpt.pt was not written by this run"):
        saver.save(model, torch.optim.AdamW(model.parameters()), iter_num=3)
        saver.check_end()
    assert (out / "ckpt.pt").read_bytes() == b"the other run's"
    assert sorted(os.listdir(out)) == ["ckpt.pt", "run.lock"]
    claim.release()


def test_signal_stop_whose_save_fails_does_not_say_resume(data_dir, tmp_path):
    """A signal stop whose checkpoint could not be written must not say "continue with --init_from=resume" as
    if it had saved: it says so and names what there is to go back to (here: nothing of this run)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out}",
                             *flags(max_iters=100000, eval_interval=100000)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out, 3, proc)
    os.makedirs(out / "ckpt.pt")  # a folder where the checkpoint goes: its atomic rename fails
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert "error: could not save checkpoint" in stdout, stdout[-2000:]
    (stopped,) = [line for line in stdout.splitlines() if line.startswith("stopped at iteration")]
    assert "--init_from=resume (and" not in stopped and "not written" in stopped, stopped
    assert "ckpt.pt was not written by this run" in stopped, stopped  # nothing good of this run to go back to


def sharded_run(out_dir):
    """A run folder with a sharded checkpoint as parallelism=fsdp writes one (here from one process)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from model import GPT, GPTConfig
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32, bias=False, dropout=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.distributed is disabled: one process, as intended
        dcp.save({"model": GPT(GPTConfig(**args)).state_dict()}, checkpoint_id=str(out_dir / "ckpt_dcp"))
    torch.save({"model_args": args, "iter_num": 3, "config": {}}, out_dir / "ckpt_dcp" / "train_state.pt")
    return out_dir


def test_convert_refuses_what_is_not_a_whole_sharded_checkpoint(tmp_path):
    import shutil

    from gpt.checkpoint import convert_sharded
    good = sharded_run(tmp_path / "good")
    damage = {  # what a copy cut short or a wrong folder leaves, and the words of its line
        "no_shard": (lambda d: os.remove(d / "__0_0.distcp"), "shard file __0_0.distcp is missing"),
        "cut_shard": (lambda d: os.truncate(d / "__0_0.distcp", 100), "__0_0.distcp is cut short (100 of"),
        "no_metadata": (lambda d: os.remove(d / ".metadata"), "its .metadata cannot be read"),
        "no_train_state": (lambda d: os.remove(d / "train_state.pt"), "it has no train_state.pt"),
        "empty": (lambda d: [os.remove(d / f) for f in os.listdir(d)], "it has no train_state.pt"),
        "a_file": (lambda d: shutil.rmtree(d) or d.write_text(""), "ckpt_dcp is not a folder"),
        "no_ckpt_dcp": (lambda d: shutil.rmtree(d), "it has no ckpt_dcp/ folder"),
    }
    for name, (spoil, words) in damage.items():
        out = tmp_path / name
        shutil.copytree(good, out)
        spoil(out / "ckpt_dcp")
        with pytest.raises(UserError) as e:
            convert_sharded(str(out))
        assert words in str(e.value), name
        assert os.listdir(out) == (["ckpt_dcp"] if (out / "ckpt_dcp").exists() else []), name  # nothing written
    with pytest.raises(UserError, match="does not exist"):
        convert_sharded(str(tmp_path / "nowhere"))
    assert convert_sharded(str(good)) == str(good / "ckpt.pt")
    assert load_checkpoint(str(good / "ckpt.pt"))["iter_num"] == 3


def test_a_checkpoints_dataset_name_cannot_read_outside_data(tmp_path):
    from gpt.checkpoint import load_model
    from model import GPT, GPTConfig
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32, bias=False, dropout=0.0)
    torch.save({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "iter_num": 0,
                "config": {"dataset": "../../etc"}}, tmp_path / "ckpt.pt")  # nanoGPT's: no dataset_meta
    with pytest.raises(UserError, match="'../../etc' .* is not the name of a folder in data/"):
        load_model("resume", str(tmp_path))


def hostile_sharded_run(out_dir, marker):
    """A sharded run folder whose .metadata, unpickled as torch's DCP reader does, would create `marker`: DCP's
    own metadata with one more entry whose class calls os.system."""
    from gpt.checkpoint import sharded
    sharded_run(out_dir)
    metadata = sharded.read_metadata(str(out_dir / "ckpt_dcp"))  # a real one reads (no false refusal)
    metadata.planner_data = {"x": _Exploit(marker)}
    with open(out_dir / "ckpt_dcp" / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return out_dir


def test_a_sharded_checkpoints_metadata_cannot_run_code(tmp_path):
    """Every path that opens a ckpt_dcp/ refuses a .metadata naming a class no DCP metadata holds, in one line,
    before DCP's unrestricted unpickler sees it: the conversion, an fsdp resume (its loading of the training
    state and of the weights), sample.py and export.py."""
    from gpt import checkpoint
    from gpt.checkpoint import sharded
    from model import GPT, GPTConfig
    marker = tmp_path / "pwned"
    out = hostile_sharded_run(tmp_path / "out", marker)
    folder, unsafe = out / "ckpt_dcp", f"{out / 'ckpt_dcp' / '.metadata'} is unsafe, not loaded: it names posix.system"
    # sample.py and export.py refuse a sharded checkpoint newer than any ckpt.pt before reading it: convert it
    for script, args, words in (("convert_checkpoint.py", [], unsafe), ("sample.py", ["--device=cpu"], "convert"),
                                ("export.py", [], "convert")):
        r = run(script, f"--out_dir={out}", *args, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (script, r.stderr[-2000:])
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and words in last, (script, r.stderr)
    for load in (lambda: checkpoint.load_for_resume(str(out), "fsdp"), lambda: sharded.load_train_state(str(folder)),
                 lambda: sharded.load_sharded(str(folder), GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2)), None)):
        with pytest.raises(UserError, match=unsafe):
            load()
    assert not marker.exists() and not (out / "ckpt.pt").exists()
    with open(folder / ".metadata", "wb") as f:  # a bare exploit, without DCP's classes around it
        pickle.dump(_Exploit(marker), f)
    with pytest.raises(UserError, match=unsafe):
        sharded.convert_sharded(str(out))
    assert not marker.exists()
