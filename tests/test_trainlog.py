"""
The run log: its end lines and "end" row, what a resumed run says about the rows it drops, and a log never
written through a link nor into a file another name shares.

wandb_log=True, for real: the wandb package in offline mode (no account, no network) records the config and
every row of the training log under stable names, and a resumed run goes on in the same wandb run. The
offline run folders are read back with `wandb leet inspect --json`, wandb's own reader of its .wandb files.
"""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import flags, run, tiny, write_char_dataset

from gpt.monitor.trainlog import TrainLog, read_log
from gpt.runtime.errors import UserError

TINY = tiny(eval_interval=3, dataset="chars", wandb_log=True, wandb_project="nanogpt-test", wandb_run_name="tiny",
            hellaswag_interval=3, sample_interval=3, num_samples_train=2, sample_max_tokens=4, sample_prompt="ROMEO:")
HELLASWAG = {"ind": 0, "activity_label": "Cooking", "ctx_a": "A man is in a kitchen.", "ctx_b": "he",
             "ctx": "A man is in a kitchen. he", "split": "val", "split_type": "indomain", "label": 0,
             "endings": ["cuts an onion.", "sings.", "sleeps.", "opens the fridge."], "source_id": "x~0"}


@pytest.fixture(scope="module")
def chars(tmp_path_factory, corpus_path):
    """A character dataset whose characters cover the HellaSwag example's too."""
    d = write_char_dataset(tmp_path_factory.mktemp("wandb_chars"), corpus_path, chars=20000,
                           extra_chars=json.dumps(HELLASWAG))
    (d / "hellaswag_val.jsonl").write_text(json.dumps(HELLASWAG) + "\n")
    return d


def train(data_dir, out_dir, wandb_dir, **kw):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true",
           "HELLASWAG_DIR": str(data_dir)}  # its hellaswag_val.jsonl
    run("train.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}", *flags(**{**TINY, **kw}), env=env)


def records(run_folder):
    """Every record of an offline run's .wandb file, as JSON."""
    (path,) = glob.glob(os.path.join(run_folder, "*.wandb"))
    r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "No such command" in r.stderr:
        pytest.skip("this wandb has no `wandb leet inspect` to read offline runs with")
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def history(recs):
    return [rec["history"]["item"] for rec in recs if rec["type"] == "history"]


def config(recs):
    out = {}
    for rec in recs:
        if rec["type"] == "run":
            out.update(rec["run"].get("config", {}).get("update", {}))
        elif rec["type"] == "config":
            out.update(rec["config"].get("update", {}))
    return out


@pytest.mark.needs("wandb")
def test_wandb_offline_run_holds_the_config_and_every_metric_and_resumes(chars, tmp_path):
    out_dir, wandb_dir = tmp_path / "out", tmp_path / "wandb"
    train(chars, out_dir, wandb_dir, max_iters=6)
    (first,) = glob.glob(str(wandb_dir / "wandb" / "offline-run-*"))
    run_id = torch.load(out_dir / "ckpt.pt", weights_only=True)["wandb_run_id"]
    assert first.endswith(run_id)
    recs = records(first)
    (run,) = [rec["run"] for rec in recs if rec["type"] == "run"]
    assert run["run_id"] == run_id and run["project"] == "nanogpt-test" and run["display_name"] == "tiny"
    cfg = config(recs)
    assert cfg["dataset"] == "chars" and cfg["n_layer"] == 2 and cfg["max_iters"] == 6 and cfg["wandb_log"] is True

    # every train row, under its stable names, with the log's own numbers
    log = read_log(out_dir)
    logged = {h["step"]: h for h in history(recs) if "train/loss" in h}
    train_rows = [r for r in log if r["kind"] == "train"]
    assert sorted(logged) == [r["step"] for r in train_rows] == list(range(6))
    for r in train_rows:
        h = logged[r["step"]]
        assert (h["train/loss"], h["lr"], h["grad_norm"], h["tokens_per_s"], h["tokens"]) == \
               (r["loss"], r["lr"], r["grad_norm"], r["tokens_per_s"], r["tokens"])
        assert "mfu" not in h  # null on a CPU: left out, not logged as 0
    evals = {h["step"]: h for h in history(recs) if "val/loss" in h}
    assert sorted(evals) == [0, 3, 6]
    for r in (r for r in log if r["kind"] == "eval"):
        h = evals[r["step"]]
        assert (h["val/loss"], h["eval/train_loss"], h["val/perplexity"], h["hellaswag/acc_norm"], h["hellaswag/acc"]) \
               == (r["val_loss"], r["train_loss"], r["perplexity"], r["hellaswag"], r["hellaswag_acc"])
    # the samples, as a table each time
    # none at step 0 (untrained weights, since 0138db0)
    assert [h["step"] for h in history(recs) if h.get("samples._type") == "table-file"] == [3, 6]
    for path in glob.glob(os.path.join(first, "files", "media", "table", "samples_*.table.json")):
        with open(path) as f:
            table = json.load(f)
        assert table["columns"] == ["step", "text"] and len(table["data"]) == 2
        assert all(text.startswith("ROMEO:") for _, text in table["data"])

    # resumed: the same wandb run goes on (a second offline folder with the same id, for `wandb sync`)
    train(chars, out_dir, wandb_dir, max_iters=9, init_from="resume")
    (second,) = set(glob.glob(str(wandb_dir / "wandb" / "offline-run-*"))) - {first}
    assert second.endswith(run_id)
    assert torch.load(out_dir / "ckpt.pt", weights_only=True)["wandb_run_id"] == run_id
    recs = records(second)
    assert [h["step"] for h in history(recs) if "train/loss" in h] == [6, 7, 8]
    assert [h["step"] for h in history(recs) if "val/loss" in h] == [9]
    assert config(recs)["max_iters"] == 9


def test_end_says_the_totals_what_the_run_leaves_and_what_to_type_next(tmp_path, capsys):
    log = TrainLog(tmp_path)
    # a resumed run: 1,000 steps before this launch, the token count its checkpoint kept (not step * tokens per
    # step: a run may change its batch when it resumes)
    log.end(2000, 30_000_000, 1000, 14_000_000, 835.0, 421.0, best_val_loss=1.46971,
            checkpoint=(str(tmp_path / "ckpt.pt"), 2000), next_command=f"python sample.py --out_dir={tmp_path}")
    assert capsys.readouterr().out.splitlines() == [
        "done: 2,000 steps, 30,000,000 tokens, 13m55s of training (this launch: 1,000 steps, 16,000,000 tokens "
        "in 7m01s)",
        f"best val loss 1.4697, checkpoint {tmp_path / 'ckpt.pt'} (step 2,000)",
        f"next: python sample.py --out_dir={tmp_path}"]
    assert read_log(tmp_path)[-1] == {"kind": "end", "step": 2000, "tokens": 30_000_000, "time": 835.0,
                                      "stopped": False, "best_val_loss": 1.46971,
                                      "checkpoint": str(tmp_path / "ckpt.pt"), "checkpoint_step": 2000,
                                      "best_checkpoint": None, "best_step": None,
                                      "next_command": f"python sample.py --out_dir={tmp_path}"}
    # stopped after the best: ckpt.pt holds the stop's step, the best weights another file; the row keeps the
    # resume command, which the stop's own line prints
    log.end(1218, 1218, 0, 0, 60.0, 61.0, stopped=True, best_val_loss=2.078, checkpoint=("ckpt.pt", 1218),
            best=("ckpt-best.pt", 1000), next_command="the same command plus --init_from=resume")
    assert capsys.readouterr().out.splitlines()[1] == ("best val loss 2.0780 (step 1,000, its weights in "
                                                       "ckpt-best.pt), checkpoint ckpt.pt (step 1,218)")
    assert read_log(tmp_path)[-1]["next_command"] == "the same command plus --init_from=resume"
    # a first launch stopped by a signal, without an evaluation (no best val loss): one line, nulls in the row
    log.end(1, 64, 0, 0, 2.5, 3.0, stopped=True, best_val_loss=float("inf"))
    assert capsys.readouterr().out == "stopped: 1 step, 64 tokens, 2.5s of training\n"
    assert read_log(tmp_path)[-1] == {"kind": "end", "step": 1, "tokens": 64, "time": 2.5, "stopped": True,
                                      "best_val_loss": None, "checkpoint": None, "checkpoint_step": None,
                                      "best_checkpoint": None, "best_step": None, "next_command": None}

def rows_of(*rows):
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_a_resume_after_a_clean_stop_drops_its_end_row_quietly(tmp_path, capsys):
    kept = rows_of({"kind": "plan", "step": 0}, *({"kind": "train", "step": s} for s in range(4)))
    (tmp_path / "log.jsonl").write_text(kept + rows_of({"kind": "end", "step": 4, "stopped": True}))
    TrainLog(tmp_path).resume_at(len(kept))
    assert (tmp_path / "log.jsonl").read_text() == kept and capsys.readouterr().out == ""
    # steps logged after the checkpoint (the run was killed): named, as they run again
    (tmp_path / "log.jsonl").write_text(kept + rows_of({"kind": "train", "step": 4}, {"kind": "eval", "step": 4},
                                                       {"kind": "train", "step": 5}) + '{"kind": "tr')
    TrainLog(tmp_path).resume_at(len(kept))
    assert (tmp_path / "log.jsonl").read_text() == kept
    assert capsys.readouterr().out == (f"log: steps 4-5 ran after the checkpoint and run again: dropped 4 rows of "
                                       f"{tmp_path / 'log.jsonl'} written after it\n")


def test_the_log_is_never_written_through_a_link(tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n" * 3)
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.jsonl").symlink_to(target)
    log = TrainLog(out)
    with pytest.raises(UserError, match="it is a symbolic link, which a run never writes through"):
        log.resume_at(4)
    log.write(kind="train", step=0)  # a link made while the run goes on: one line, and training goes on
    assert capsys.readouterr().out.startswith(f"error: could not write to {out / 'log.jsonl'} (it is a symbolic "
                                              f"link, which a run never writes through)")
    assert target.read_text() == "keep me\n" * 3


def test_a_hard_linked_log_becomes_the_runs_own(tmp_path, capsys):
    copy, out = tmp_path / "copy", tmp_path / "out"
    copy.mkdir()
    out.mkdir()
    kept = rows_of({"kind": "train", "step": 0})
    (copy / "log.jsonl").write_text(kept + rows_of({"kind": "end", "step": 1}))
    os.link(copy / "log.jsonl", out / "log.jsonl")  # as `cp -al copy out` leaves it; out resumes
    log = TrainLog(out)
    log.resume_at(len(kept))
    log.write(kind="train", step=1)
    assert [row["kind"] for row in read_log(copy)] == ["train", "end"]  # the copy's log as it was
    assert [row["step"] for row in read_log(out)] == [0, 1] and os.stat(out / "log.jsonl").st_nlink == 1
    assert "was one of 2 names of a file (hard links); this run writes to a copy of its own" in capsys.readouterr().out


@pytest.mark.parametrize("tail", ["", '{"kind": "train", "st'], ids=["whole-rows", "cut-off-row"])
def test_a_log_shorter_than_the_checkpoints_position_is_never_padded(tmp_path, capsys, tail):
    # the log lost rows since the checkpoint (cut or replaced by hand): its whole rows stay, a cut-off last line
    # goes (the next row starts a line of its own), no NUL bytes, and a note says so
    kept = rows_of({"kind": "plan", "step": 0}, {"kind": "train", "step": 0})
    (tmp_path / "log.jsonl").write_text(kept + tail)
    log = TrainLog(tmp_path)
    log.resume_at(len(kept) + len(tail) + 5000)
    log.write(kind="train", step=7)
    data = (tmp_path / "log.jsonl").read_bytes()
    assert b"\0" not in data and data.decode() == kept + rows_of({"kind": "train", "step": 7})
    cut = f", and its cut-off last line ({len(tail)} bytes) dropped" if tail else ""
    assert capsys.readouterr().out == (
        f"note: {tmp_path / 'log.jsonl'} is {len(kept) + len(tail):,} bytes, shorter than the "
        f"{len(kept) + len(tail) + 5000:,} it held when the checkpoint was saved: it lost rows since; its 2 whole "
        f"rows are kept{cut}, and this run's rows follow them, so the steps in between have no rows\n")
