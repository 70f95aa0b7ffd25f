"""
plot.py: a run's log becomes a PNG of its curves; panels follow what the log holds (HellaSwag only when run).
"""
import json
import math
import os

import pytest
from conftest import run

import plot
from gpt.errors import UserError


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
