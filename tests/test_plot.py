"""
plot.py: a run's log becomes a PNG of its curves; panels follow what the log holds (HellaSwag only when run).
"""
import json
import math
import os

import pytest
from conftest import run

import plot
from gpt.runtime.errors import UserError


def write_log(out_dir, hellaswag=False):
    rows = []
    for step in range(0, 201, 10):
        rows.append({"kind": "train", "step": step, "tokens": (step + 1) * 512, "time": step / 10,
                     "loss": 4 * math.exp(-step / 100) + 1, "lr": 6e-4 * min(1, (step + 1) / 20), "grad_norm": 1.0,
                     "ms_per_step": 20.0, "tokens_per_s": 25600.0, "mfu": 0.31 if step >= 50 else None,
                     "skipped_steps": 0})
        if step % 50 == 0:
            rows.append({"kind": "eval", "step": step, "tokens": step * 512, "time": step / 10,
                         "train_loss": 4 * math.exp(-step / 100) + 1.05, "val_loss": 4 * math.exp(-step / 100) + 1.1,
                         "perplexity": 9.0, "hellaswag": 0.25 + step / 4000 if hellaswag else None,
                         "hellaswag_acc": 0.25 if hellaswag else None})
            rows.append({"kind": "sample", "step": step, "samples": ["Hello"]})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@pytest.mark.needs("matplotlib")
def test_plot_writes_the_curves(tmp_path):
    write_log(tmp_path / "plain")
    run("plot.py", f"--out_dir={tmp_path / 'plain'}")
    assert png_size(tmp_path / "plain" / "curves.png") == (1200, 1200)  # loss x 2, lr, grad norm, tokens/s
    write_log(tmp_path / "hs", hellaswag=True)
    plot.main([f"--out_dir={tmp_path / 'hs'}", f"--output={tmp_path / 'report' / 'run.png'}"])
    assert png_size(tmp_path / "report" / "run.png") == (1200, 1200)  # and HellaSwag, beside tokens/s


@pytest.mark.needs("matplotlib")
def test_plot_has_a_gradient_norm_panel(tmp_path):
    write_log(tmp_path)
    rows = [r for r in plot.read_log(tmp_path) if r["kind"] in ("train", "eval")]
    fig = plot.figure(rows, "run")
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert "gradient norm (before clipping)" in panels
    assert list(panels["gradient norm (before clipping)"].lines[0].get_ydata()) == [1.0] * 21


def test_plot_without_a_log_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="no training log rows"):
        plot.main([f"--out_dir={tmp_path}"])


GOOD_ROW = {"kind": "train", "step": 0, "tokens": 512, "loss": 4.0, "lr": 1e-3}


@pytest.mark.needs("matplotlib")
@pytest.mark.parametrize("lines,words", [
    (["[1, 2]"], "row 2 is [1, 2], not a JSON object"),
    (["3"], "row 2 is 3, not a JSON object"),
    ([json.dumps({**GOOD_ROW, "loss": "high"})], "loss is not a number"),
    ([json.dumps({**GOOD_ROW, "step": True})], "step is not a number"),
    ([json.dumps({"kind": "eval", "val_loss": 3.0})], "step, tokens are not numbers"),
], ids=["list", "number", "string-value", "bool-step", "no-step"])
def test_a_damaged_log_row_is_one_line_naming_it(tmp_path, lines, words):
    (tmp_path / "log.jsonl").write_text("\n".join([json.dumps(GOOD_ROW), *lines]) + "\n")
    with pytest.raises(UserError, match="log.jsonl") as e:
        plot.main([f"--out_dir={tmp_path}"])
    assert words in str(e.value) and "remove that line" in str(e.value)
    assert not (tmp_path / "curves.png").exists()


@pytest.mark.needs("matplotlib")
def test_a_cut_off_last_row_and_nan_losses_still_plot(tmp_path):
    rows = [json.dumps(GOOD_ROW), json.dumps({**GOOD_ROW, "step": 1, "loss": float("nan")})]
    (tmp_path / "log.jsonl").write_text("\n".join(rows) + '\n{"kind": "train", "st')  # a run still writing
    plot.main([f"--out_dir={tmp_path}"])
    assert png_size(tmp_path / "curves.png")


@pytest.mark.needs("matplotlib")
def test_output_is_checked_before_the_log_is_read(tmp_path):
    # no log at all: each of these must be refused for the output, not for the missing log
    (tmp_path / "a_file").write_text("")
    for output, words in [("run.docx", ".docx is not a format matplotlib writes"), (".", "is a folder"),
                          ("a_file/run.png", "is not a folder")]:
        with pytest.raises(UserError, match="--output=") as e:
            plot.main([f"--out_dir={tmp_path / 'empty'}", f"--output={tmp_path / output}"])
        assert words in str(e.value)
    (tmp_path / "log.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")
    plot.main([f"--out_dir={tmp_path}", f"--output={tmp_path / 'new' / 'run'}"])  # no extension: PNG
    assert png_size(tmp_path / "new" / "run.png")
    plot.main([f"--out_dir={tmp_path}", f"--output={tmp_path / 'run.svg'}"])
    assert (tmp_path / "run.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(UserError, match="log.jsonl is not a folder"):
        plot.main([f"--out_dir={tmp_path / 'log.jsonl'}"])  # out_dir's curves.png goes under a file: refused
    os.remove(tmp_path / "log.jsonl")
    os.makedirs(tmp_path / "log.jsonl")
    with pytest.raises(UserError, match="log.jsonl cannot be read"):
        plot.main([f"--out_dir={tmp_path}"])
