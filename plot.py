"""The training curves of a run as a PNG, from its log (out_dir/log.jsonl): loss against steps and against tokens, the
learning rate, the gradient norm, tokens/s (and MFU on a GPU), HellaSwag when the run has it.

$ python plot.py --out_dir=out                         # writes out/curves.png
$ python plot.py --out_dir=out --output=report/run.png
$ python plot.py --out_dir=out --output=run.svg           # any format matplotlib writes, by the extension
"""
import json
import os
import shutil
import sys

import configurator
from gpt.data import check_output_file
from gpt.monitor.trainlog import LOG_NAME, read_log
from gpt.runtime.errors import UserError, install
from gpt.runtime.files import atomic_write

# the values the panels plot; each is a number or null in a train or eval row (step and tokens always numbers)
PLOTTED = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "train_loss", "val_loss", "hellaswag", "hellaswag_acc")


def series(rows, kind, x, key, scale=1.0):
    points = [(r[x], r[key] * scale) for r in rows if r["kind"] == kind and r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_losses(ax, rows, x):
    ax.plot(*series(rows, "train", x, "loss"), lw=0.8, alpha=0.6, label="train loss (step)")
    ax.plot(*series(rows, "eval", x, "train_loss"), "o-", ms=3, label="train loss (eval)")
    ax.plot(*series(rows, "eval", x, "val_loss"), "o-", ms=3, label="val loss")
    ax.set(title=f"loss vs {x}", xlabel=x, ylabel="loss")
    ax.legend()


def pyplot():
    try:
        import matplotlib  # optional (its absence is one error line) and slow to import
    except ImportError:
        raise UserError("plot.py needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def check_output(output):
    """The file to write, checked before the log is read: a format matplotlib can write here (pgf only with
    its TeX program), a folder that exists or can be made. No extension is matplotlib's PNG, named .png."""
    tex = pyplot().rcParams["pgf.texsystem"]
    from matplotlib.backend_bases import FigureCanvasBase
    formats = sorted(f for f in FigureCanvasBase.get_supported_filetypes() if f != "pgf" or shutil.which(tex))
    if os.path.isdir(output):
        raise UserError(f"--output={output} is a folder: name the file to write, e.g. "
                        f"--output={os.path.join(output, 'curves.png')}")
    ext = os.path.splitext(output)[1].lower()
    if not ext:
        output += ".png"
    elif ext[1:] not in formats:
        why = f"needs {tex}, which is not installed" if ext == ".pgf" else "is not a format matplotlib writes"
        raise UserError(f"--output={output}: {ext} {why}; end the name with one of .{', .'.join(formats)}")
    return check_output_file(output, "--output", make_folder=True)


def training_rows(out_dir):
    """The log's train and eval rows, after checking that every row is an object and every value the panels
    plot is a number (or null): a damaged or hand-edited log is one line naming the row."""
    path = os.path.join(out_dir, LOG_NAME)
    try:
        rows = read_log(out_dir)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path} cannot be read ({getattr(e, 'strerror', None) or e}): point --out_dir at a run folder")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise UserError(f"{path}: row {n} is {json.dumps(row)[:80]}, not a JSON object: the log was damaged "
                            f"or edited; remove that line")
    rows = [r for r in rows if r.get("kind") in ("train", "eval")]
    for row in rows:
        wrong = [k for k in ("step", "tokens") if not is_number(row.get(k))]
        wrong += [k for k in PLOTTED if row.get(k) is not None and not is_number(row[k])]
        if wrong:
            raise UserError(f"{path}: in the {row['kind']} row {json.dumps(row)[:100]}, {', '.join(wrong)} "
                            f"{'is not a number' if len(wrong) == 1 else 'are not numbers'}: the log was damaged or "
                            f"edited; remove that line")
    if not rows:
        raise UserError(f"no training log rows in {path}: train first, or point --out_dir at a run folder")
    return rows


def is_number(value):
    # not bool (JSON keeps it apart), nor an integer too large for a float; NaN and inf are a run's own values
    return type(value) is float or (type(value) is int and abs(value) <= sys.float_info.max)


def figure(rows, title):
    plt = pyplot()

    def train_curve(ax, key, name, **style):
        ax.plot(*series(rows, "train", "step", key), **style)
        ax.set(title=name, xlabel="step")

    def throughput(ax):
        train_curve(ax, "tokens_per_s", "tokens/s", lw=0.8)
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

    panels = [lambda ax: plot_losses(ax, rows, "step"), lambda ax: plot_losses(ax, rows, "tokens"),
              lambda ax: train_curve(ax, "lr", "learning rate"),
              lambda ax: train_curve(ax, "grad_norm", "gradient norm (before clipping)", lw=0.8), throughput]
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
    install()
    settings = dict(
        out_dir='out',  # the run folder, holding log.jsonl
        output='',  # the image to write, its format by its extension (.png, .svg, .pdf, ...); '' = <out_dir>/curves.png
    )
    s = configurator.apply(settings, argv)
    output = check_output(s['output'] or os.path.join(s['out_dir'], 'curves.png'))
    fig = figure(training_rows(s['out_dir']), os.path.basename(os.path.abspath(s['out_dir'])))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with atomic_write(output) as f:  # a link at output is replaced, never written through
            fig.savefig(f, format=os.path.splitext(output)[1][1:].lower(), dpi=100)
    except OSError as e:  # what no check can foresee: a full disk, a quota
        raise UserError(f"could not write {output} ({e.strerror or e})") from None
    print(f"wrote {output}")


if __name__ == "__main__":
    main(sys.argv[1:])
