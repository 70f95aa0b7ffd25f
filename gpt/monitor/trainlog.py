"""The run's machine-readable log, out_dir/log.jsonl: one JSON object per line, appended across resumes (which trim it:
docs/checkpoints.md#the-training-log); with wandb_log=True every row also goes to Weights & Biases. Never written
through a link: rundir.py refuses one before the run starts, and O_NOFOLLOW here also catches one made since."""
import json
import math
import netrc
import os
import shutil
import stat
import time
from contextlib import suppress
from urllib.parse import urlsplit

from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write

LOG_NAME = "log.jsonl"
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # Windows has none (nor links a user makes without privileges)
# wandb's names for the log's values where they differ, so that per-step and evaluation numbers never share
# a chart (the step's loss is train/loss, the evaluation's estimate eval/train_loss); others keep their name
WANDB_NAMES = {"train": {"loss": "train/loss"},
               "eval": {"train_loss": "eval/train_loss", "val_loss": "val/loss", "perplexity": "val/perplexity",
                        "hellaswag": "hellaswag/acc_norm", "hellaswag_acc": "hellaswag/acc"}}


class TrainLog:
    def __init__(self, out_dir, enabled=True):
        self.path = os.path.join(out_dir, LOG_NAME)
        self.enabled = enabled  # only the master process writes
        self.wandb = None  # a wandb run (start_wandb) that gets every row too
        self.failing = False  # the last write failed (a full disk): said once, until one succeeds
        self.owned = False  # checked that the log is this run's own file, not a name shared with another

    def position(self):
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def open(self, flags):
        """A descriptor of the log, never through a link, and of a file no other name shares."""
        if not self.owned:
            self.own()
        try:
            return os.open(self.path, flags | NOFOLLOW, 0o644)
        except OSError as e:
            if os.path.islink(self.path):
                raise OSError(e.errno, "it is a symbolic link, which a run never writes through", self.path)
            raise

    def own(self):
        """Make the log a file of this run's own if it has other names (hard links)."""
        self.owned = True
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            with open(self.path, "rb") as src, atomic_write(self.path) as dst:
                shutil.copyfileobj(src, dst)
            print(f"note: {self.path} was one of {st.st_nlink} names of a file (hard links); this run writes to a "
                  f"copy of its own and leaves the others as they were")

    def resume_at(self, position):
        """Cut the log back to where it stood when the checkpoint we resume from was saved, and say which training
        steps logged after it run again (a clean stop's "end" row, or a plan alone, is dropped quietly)."""
        if not self.enabled or not os.path.lexists(self.path):
            return
        try:
            fd = self.open(os.O_RDWR)
        except OSError as e:
            raise UserError(f"cannot resume the log {self.path} ({e.strerror or e}): put the run's own log there")
        with os.fdopen(fd, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size < position:  # never truncate() past the end: that pads the log with NUL bytes
                return self.shorter_than(f, size, position)
            f.seek(position)
            dropped = f.read().splitlines()
            f.truncate(position)
        if steps := {row["step"] for row in parse_rows(dropped)
                     if isinstance(row, dict) and row.get("kind") == "train" and isinstance(row.get("step"), int)}:
            what = f"step {min(steps):,}" if len(steps) == 1 else f"steps {min(steps):,}-{max(steps):,}"
            print(f"log: {what} ran after the checkpoint and run{'s' * (len(steps) == 1)} again: dropped "
                  f"{len(dropped)} rows of {self.path} written after it")

    def shorter_than(self, f, size, position):
        """The log lost rows since the checkpoint was saved (cut, replaced or edited by hand): keep its whole
        rows, drop a cut-off last line so that the next row starts a line of its own, and say so."""
        f.seek(0)
        data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        f.truncate(len(whole))
        cut = f", and its cut-off last line ({size - len(whole)} bytes) dropped" if len(whole) < size else ""
        print(f"note: {self.path} is {size:,} bytes, shorter than the {position:,} it held when the checkpoint "
              f"was saved: it lost rows since; its {len(parse_rows(whole.splitlines())):,} whole rows are kept"
              f"{cut}, and this run's rows follow them, so the steps in between have no rows")

    def write(self, **row):
        if not self.enabled:
            return
        # NaN and inf are not JSON: write them as null
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        try:
            with os.fdopen(self.open(os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as f:
                f.write(json.dumps(row) + "\n")
            self.failing = False
        except OSError as e:  # a full disk: say so once, and go on training
            if not self.failing:
                print(f"error: could not write to {self.path} ({e.strerror or e}): rows are lost until it can")
            self.failing = True
        if self.wandb is not None and row["kind"] not in ("end", "plan", "startup"):  # wandb has the plan as its config
            self.wandb.log(wandb_metrics(row))

    def end(self, step, tokens, start_step, start_tokens, seconds, launch_seconds, stopped=False,
            best_val_loss=None, checkpoint=None, best=None, next_command=None):
        """The run is over (done, or stopped to be resumed): print its totals, checkpoints and next command, and write
        them in an "end" row (the dashboard's sign that the run is not live). tokens: the total over every launch
        (start_tokens: when this one started); checkpoint, best: (path, step) of the last and of the best val loss's."""
        if not self.enabled:
            return
        launch = (f" (this launch: {step - start_step:,} steps, {tokens - start_tokens:,} tokens in "
                  f"{duration(launch_seconds)})" if start_step else "")
        print(f"{'stopped' if stopped else 'done'}: {step:,} step{'s' * (step != 1)}, {tokens:,} tokens, "
              f"{duration(seconds)} of training{launch}")
        kept = []
        if best_val_loss is not None and math.isfinite(best_val_loss):
            elsewhere = best and best[0] != (checkpoint or (None,))[0]
            kept.append(f"best val loss {best_val_loss:.4f}" + (f" (step {best[1]:,}" if best else "")
                        + (f", its weights in {best[0]})" if elsewhere else ")" if best else ""))
        if checkpoint:
            kept.append(f"checkpoint {checkpoint[0]} (step {checkpoint[1]:,})")
        if kept:
            print(", ".join(kept))
        if next_command and not stopped:
            print(f"next: {next_command}")
        self.write(kind="end", step=step, tokens=tokens, time=seconds, stopped=stopped, best_val_loss=best_val_loss,
                   checkpoint=checkpoint and checkpoint[0], checkpoint_step=checkpoint and checkpoint[1],
                   best_checkpoint=best and best[0], best_step=best and best[1], next_command=next_command)


def duration(seconds):
    """12.3s, 4m05s, 2h03m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def wandb_metrics(row):
    """A log row as a wandb.log dict: step, tokens, time and its values under stable names (nulls left out)."""
    kind = row["kind"]
    metrics = {"step": row["step"], "tokens": row["tokens"], "time": row["time"]}
    if kind == "sample":
        import wandb  # optional and slow to import: imported only by runs that log to it
        metrics["samples"] = wandb.Table(columns=["step", "text"], data=[[row["step"], t] for t in row["samples"]])
        return metrics
    for k, v in row.items():
        if k not in metrics and k != "kind" and v is not None:
            metrics[WANDB_NAMES.get(kind, {}).get(k, k)] = v
    return metrics


def check_wandb():
    """Before a wandb_log run touches anything, from what wandb.init reads (no network, nothing written): wandb is
    installed and logs offline or has credentials, else one UserError naming the fix, not a prompt or a traceback."""
    try:
        import wandb  # noqa: F401 (only whether it is installed: its settings come from wandb.sdk)
    except ImportError:
        raise UserError("wandb_log=True needs the wandb package: pip install wandb (or leave wandb_log off)")
    settings = None  # another wandb version's layout: the environment alone then
    with suppress(Exception):  # wandb's settings as wandb.init reads them (environment and settings files)
        from wandb.sdk import wandb_setup
        settings = wandb_setup.singleton().settings
    env = os.environ.get
    mode = env("WANDB_MODE") or getattr(settings, "mode", None) or "online"
    if mode in ("offline", "dryrun", "disabled") or env("WANDB_DISABLED", "").lower() in ("true", "1"):
        return
    if env("WANDB_API_KEY") or env("WANDB_IDENTITY_TOKEN_FILE") or getattr(settings, "api_key", None):
        return
    base_url = env("WANDB_BASE_URL") or getattr(settings, "base_url", None) or "https://api.wandb.ai"
    for path in [env("NETRC")] if env("NETRC") else [os.path.expanduser(name) for name in ("~/.netrc", "~/_netrc")]:
        with suppress(OSError, netrc.NetrcParseError):
            if netrc.netrc(path).authenticators(urlsplit(base_url).netloc):
                return
    raise UserError(f"wandb_log=True, but wandb has no API key for {base_url}: run `wandb login` (or set "
                    f"WANDB_API_KEY), or log offline with WANDB_MODE=offline and upload later with `wandb sync`")


def start_wandb(project, name, config, run_id=None):
    """A Weights & Biases run with the run's config, charted against our step (not wandb's own counter, which
    a resumed run would disagree with). Given the id a checkpoint kept, the same wandb run goes on."""
    import wandb
    run = wandb.init(project=project, name=name, id=run_id, resume="allow" if run_id else None)
    run.config.update(config, allow_val_change=True)  # a resumed run may change some settings (max_iters)
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run


def step_line(step, loss, lr, grad_norm, dt, tokens_per_iter, mfu, mem_gib, tokens, percent):
    """The line a training step prints (build-nanogpt's, with more: docs/monitoring.md); MFU and memory where known."""
    extra = (f", mfu {mfu * 100:.2f}%" if mfu is not None and mfu >= 0 else "") + (
        f", mem {mem_gib:.1f}GiB" if mem_gib else "")
    return (f"iter {step}: loss {loss:.4f}, lr {lr:.3e}, norm {grad_norm:.4f}, time {dt * 1000:.2f}ms, "
            f"tok/s {tokens_per_iter / dt:,.0f}{extra}, {tokens:,} tokens ({percent:.1f}%)")


class Startup:
    """Where a launch's time goes before its first step: parts timed one after another, said and logged at step 0."""

    def __init__(self, launch_time, imported_torch):
        self.launch, self.parts = launch_time, []
        self.part('import torch', until=imported_torch)
        self.part('other imports')

    def part(self, name, until=None):
        """The time since the last part (until now or `until`) as part `name`, in ms as logged: line and row agree."""
        self.parts.append((name, round((until or time.time()) - self.launch - sum(s for _, s in self.parts), 3)))

    def row(self):
        return {name.replace(' ', '_'): seconds for name, seconds in self.parts}

    def line(self, compiled):
        """compiled: the first evaluation compiles the model (torch.compile is lazy), and step 0 its backward."""
        total = sum(seconds for _, seconds in self.parts)
        what = ", ".join(f"{name} {seconds:.1f}s" + (" with compiling" if compiled and name == "first evaluation"
                                                     else "") for name, seconds in self.parts)
        return f"startup: first step at {total:.1f}s since launch ({what})" + (
            "; step 0 compiles the training step" if compiled else "")


def parse_rows(lines):
    """The JSON rows of lines, skipping any that is not JSON: one cut short by a crash, or still being written."""
    rows = []
    for line in lines:
        with suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def read_log(out_dir):
    path = os.path.join(out_dir, LOG_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return parse_rows(f)
