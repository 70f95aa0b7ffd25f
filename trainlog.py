"""
The run's machine-readable log: out_dir/log.jsonl, one JSON object per line, appended across resumes.

Rows of kind "train" (every log_interval steps) and "eval" (every eval_interval steps), with stable keys:
    step, tokens, time (seconds since the run's first launch), kind,
    train:  loss, lr, grad_norm, ms_per_step, tokens_per_s, mfu, skipped_steps
    eval:   train_loss, val_loss, perplexity (of val), and more as other evaluations add them
Values that do not apply are null. The checkpoint records the log's length in bytes, so a resumed run
first drops the rows written after that checkpoint (the steps it is about to run again) and says so.
"""
import json
import math
import os

LOG_NAME = "log.jsonl"


class TrainLog:

    def __init__(self, out_dir, enabled=True):
        self.path = os.path.join(out_dir, LOG_NAME)
        self.enabled = enabled  # only the master process writes

    def position(self):
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def resume_at(self, position):
        """Cut the log back to where it stood when the checkpoint we resume from was saved."""
        if not self.enabled or not os.path.exists(self.path):
            return
        size = os.path.getsize(self.path)
        if size > position:
            with open(self.path, "rb") as f:
                f.seek(position)
                dropped = f.read().count(b"\n")
            with open(self.path, "r+b") as f:
                f.truncate(position)
            print(f"log: dropped {dropped} rows of {self.path} written after the checkpoint (those steps run again)")

    def write(self, **row):
        if not self.enabled:
            return
        # NaN and inf are not JSON: write them as null
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def read_log(out_dir):
    """All rows of a run's log (a partly written last line, from a run still going, is skipped)."""
    path = os.path.join(out_dir, LOG_NAME)
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows
