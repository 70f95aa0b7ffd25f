"""
The training curves of a run as a PNG, from its log (out_dir/log.jsonl): loss against steps and against
tokens, the learning rate, the gradient norm, tokens/s (and MFU on a GPU), HellaSwag when the run has it.

$ python plot.py --out_dir=out                         # writes out/curves.png
$ python plot.py --out_dir=out --output=report/run.png
"""
import os
import sys

import configurator
from gpt import errors
from gpt.errors import UserError
from gpt.trainlog import LOG_NAME, read_log


def series(rows, kind, x, key, scale=1.0):
    """(xs, ys) of one value of one kind of row, where it is not null."""
    points = [(r[x], r[key] * scale) for r in rows if r["kind"] == kind and r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_losses(ax, rows, x):
    ax.plot(*series(rows, "train", x, "loss"), lw=0.8, alpha=0.6, label="train loss (step)")
    ax.plot(*series(rows, "eval", x, "train_loss"), "o-", ms=3, label="train loss (eval)")
    ax.plot(*series(rows, "eval", x, "val_loss"), "o-", ms=3, label="val loss")
    ax.set(title=f"loss vs {x}", xlabel=x, ylabel="loss")
    ax.legend()


def figure(rows, title):
    try:
        import matplotlib
    except ImportError:
        raise UserError("plot.py needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    panels = [lambda ax: plot_losses(ax, rows, "step"), lambda ax: plot_losses(ax, rows, "tokens")]

    def lr(ax):
        ax.plot(*series(rows, "train", "step", "lr"))
        ax.set(title="learning rate", xlabel="step")

    def grad_norm(ax):
        ax.plot(*series(rows, "train", "step", "grad_norm"), lw=0.8)
        ax.set(title="gradient norm (before clipping)", xlabel="step")

    def throughput(ax):
        ax.plot(*series(rows, "train", "step", "tokens_per_s"), lw=0.8)
        ax.set(title="tokens/s", xlabel="step")
        steps, mfu = series(rows, "train", "step", "mfu", 100)
        if mfu:
            right = ax.twinx()
            right.plot(steps, mfu, color="tab:orange", lw=0.8)
            right.set_ylabel("MFU (%)", color="tab:orange")

    def hellaswag(ax):
        ax.plot(*series(rows, "eval", "step", "hellaswag"), "o-", ms=3, label="acc_norm")
        ax.plot(*series(rows, "eval", "step", "hellaswag_acc"), "o-", ms=3, label="acc")
        ax.set(title="HellaSwag", xlabel="step", ylabel="accuracy")
        ax.legend()

    panels += [lr, grad_norm, throughput]
    if series(rows, "eval", "step", "hellaswag")[0]:
        panels.append(hellaswag)
    nrows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(nrows, 2, figsize=(12, 4 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        panel(ax)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv):
    errors.install()
    settings = dict(
        out_dir='out',  # the run folder, holding log.jsonl
        output='',  # the PNG to write; '' = <out_dir>/curves.png
    )
    s = configurator.apply(settings, argv)
    rows = [r for r in read_log(s['out_dir']) if r.get("kind") in ("train", "eval")]
    if not rows:
        raise UserError(f"no training log rows in {os.path.join(s['out_dir'], LOG_NAME)}: "
                        f"train first, or point --out_dir at a run folder")
    output = s['output'] or os.path.join(s['out_dir'], 'curves.png')
    fig = figure(rows, os.path.basename(os.path.abspath(s['out_dir'])))
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=100)
    print(f"wrote {output}")


if __name__ == "__main__":
    main(sys.argv[1:])
