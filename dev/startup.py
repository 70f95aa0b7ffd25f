#!/usr/bin/env python3
"""
Where the time goes between launch and the first training step (docs/records/2026-11-27-speedrun.md's start-up table):
each piece timed in a fresh process, then train.py itself, whose `startup: first step at X s since launch`
line is the total.

    python dev/startup.py config/speedrun_gcide.py                  # on a GPU machine, data/gcide ready
    python dev/startup.py config/speedrun_gcide.py --device=cpu     # the CPU numbers of the table
"""
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PIECES = [  # (what, code timed after its setup, setup)
    ("import torch", "import torch", ""),
    ("import torch._dynamo (torch.optim's first optimizer imports it)", "import torch._dynamo", "import torch"),
    ("import train.py's other modules", "import configurator, model; from gpt import checkpoint, data, optim; "
     "from gpt.training import plan, settings; from gpt.runtime import distributed, hardware; "
     "from gpt.training import evaluation, schedule, step, stepgraph; from gpt.data import loader, tokenizer; "
     "from gpt.monitor import trainlog",
     "import torch"),
    ("build the model on the CPU (its init), config's shape",
     "torch.manual_seed(0); m = GPT(GPTConfig(**shape))", "import torch; from model import GPT, GPTConfig"),
    ("build the model with init_device='device' (CUDA where there is one: its start included)",
     "m = plan.init_model(GPTConfig(**shape).__dict__, 0, dev); m.to(dev); sync()",
     "import torch; from gpt.training import plan; from model import GPTConfig\n"
     "dev = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
     "sync = torch.cuda.synchronize if dev == 'cuda' else (lambda: None)"),
    ("check train.bin and val.bin: every id within the vocabulary (a max over each file)",
     "[check_ids(open_tokens(os.path.join(data, f'{s}.bin')), None, s) for s in ('train', 'val')]",
     "import os; from gpt.data import open_tokens; from gpt.data.loader import check_ids"),
]


def timed(code, setup):
    script = f"{setup}\nimport time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main(argv):
    config, flags = argv[0], argv[1:]
    env = {}
    exec(open(config).read(), env)
    shape = {k: env[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias") if k in env}
    shape.update({k: env[k] for k in ("qk_norm", "zero_init_proj", "tie_embeddings") if k in env})
    shape["vocab_size"] = 50304
    given = dict(f[2:].split("=", 1) for f in flags if f.startswith("--") and "=" in f)
    data = given.get("data_dir") or os.path.join(ROOT, "data", given.get("dataset", env.get("dataset", "")))
    rows = []
    for what, code, setup in PIECES:
        rows.append((what, timed(code, f"{setup}\nshape = {shape!r}\ndata = {data!r}")))
    t = time.time()
    out = subprocess.run([sys.executable, "train.py", config, "--max_iters=1", "--eval_interval=1000",
                          "--checkpoint_interval=-1", "--out_dir=out-startup", *flags], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"error: train.py failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    m = re.search(r"startup: first step at ([0-9.]+)s", out.stdout)
    step0 = re.search(r"step 0: .*?([0-9.]+)s since launch", out.stdout)
    rows.append(("train.py: launch to the step-0 evaluation's line", float(step0.group(1))))
    rows.append(("train.py: launch to the first training step (`startup:` line)", float(m.group(1))))
    rows.append(("the whole process, launch to exit (1 step)", time.time() - t))
    print("| piece | seconds |\n| --- | --- |")
    for what, s in rows:
        print(f"| {what} | {s:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
