"""
What a user sees of a run and what it takes in: the step line (loss, lr, grad norm, ...), the data found at the
start and the totals at the end, total_batch_size, the lr_schedule choices, build-nanogpt's .npy shards.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from gpt.data.sources import write_meta, write_tokens
from gpt.monitor.trainlog import read_log, step_line

TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4, gradient_accumulation_steps=1,
            eval_interval=100, eval_iters=2, log_interval=1, learning_rate=1e-2, min_lr=1e-3, dropout=0.0,
            compile=False, device="cpu", dtype="float32", dataset="tiny", warmup_iters=2, lr_decay_iters=6,
            max_iters=6)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    pattern = [(i * 5 + i // 16) % 16 for i in range(4000)]
    write_tokens(d / "train.bin", pattern)
    write_tokens(d / "val.bin", pattern[:600])
    write_meta(d, {"tokenizer": "char", "vocab_size": 16, "dtype": "uint16", "itos": list("abcdefghijklmnop")})
    return d


def train(data_dir, out_dir, **kw):
    args = [f"--{k}={v}" for k, v in {**TINY, **kw}.items()]
    return subprocess.run([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)


def test_step_line_reads_like_build_nanogpt():
    line = step_line(7, 3.14159, 6e-4, 0.8123, 0.0125, 2048, 0.4123, None, 16384, 12.5)
    assert line == ("iter 7: loss 3.1416, lr 6.000e-04, norm 0.8123, time 12.50ms, tok/s 163,840, mfu 41.23%, "
                    "16,384 tokens (12.5%)")
    assert "mfu" not in step_line(0, 1.0, 1e-3, 1.0, 0.01, 64, -1.0, None, 64, 1.0)  # not measured yet


def test_total_batch_size_and_wsd_in_a_run(data_dir, tmp_path):
    from gpt.training.schedule import get_lr
    r = train(data_dir, tmp_path / "out", total_batch_size=128, lr_schedule="wsd", lr_decay_frac=0.5,
              max_iters=6, warmup_iters=1)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "total_batch_size=128 -> gradient_accumulation_steps=2" in r.stdout
    log = [row for row in read_log(tmp_path / "out") if row["kind"] == "train"]
    assert [row["tokens"] for row in log] == [128 * (n + 1) for n in range(6)]
    assert [row["lr"] for row in log] == pytest.approx([get_lr(n, 1e-2, 1e-3, 1, 6, "wsd", 0.5, 6) for n in range(6)])
    assert [row["lr"] for row in log][1:3] == [1e-2, 1e-2] and log[-1]["lr"] == pytest.approx(1e-3)


def test_step_lines_the_data_at_the_start_and_the_totals_at_the_end(data_dir, tmp_path):
    out = tmp_path / "out"
    r = train(data_dir, out, max_iters=4, checkpoint_interval=2)
    assert r.returncode == 0, r.stderr[-2000:]
    # every step line shows the lr and grad norm the log has
    log = [row for row in read_log(out) if row["kind"] == "train"]
    lines = re.findall(r"^iter (\d+): loss [\d.]+, lr ([\d.e+-]+), norm ([\d.]+), time .*ms, tok/s", r.stdout, re.M)
    assert [int(n) for n, *_ in lines] == [row["step"] for row in log] == list(range(4))
    for (_, lr, norm), row in zip(lines, log):
        assert float(lr) == pytest.approx(row["lr"], rel=1e-3) and float(norm) == pytest.approx(row["grad_norm"], 1e-3)
    assert f"data: train.bin 4,000 tokens; val.bin 600 tokens in {data_dir}, vocab_size 16 (char)" in r.stdout
    assert re.search(r"^done: 4 steps, 256 tokens, [\d.]+s of training$", r.stdout, re.M), r.stdout[-800:]
    end = read_log(out)[-1]
    assert end["kind"] == "end" and end["step"] == 4 and end["tokens"] == 256 and end["stopped"] is False
    # what the run leaves and what to type next, below the totals, and in the end row
    assert end["checkpoint"] == str(out / "ckpt.pt") and end["next_command"] == f"python sample.py --out_dir={out}"
    assert re.search(rf"^done: .*\n(best val loss [\d.]+, )?checkpoint {re.escape(str(out / 'ckpt.pt'))} \(step 4\)\n"
                     rf"next: python sample.py --out_dir={re.escape(str(out))}$", r.stdout, re.M), r.stdout[-800:]
    # resumed for more: the end row goes (it came after the checkpoint); the new end counts this launch too
    r = train(data_dir, out, max_iters=6, checkpoint_interval=2, init_from="resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^done: 6 steps, 384 tokens, [\d.]+s of training \(this launch: 2 steps, 128 tokens in "
                     r"[\d.]+s\)$", r.stdout, re.M), r.stdout[-800:]
    assert [row["step"] for row in read_log(out) if row["kind"] == "end"] == [6]


def test_the_start_counts_shards(tmp_path):
    from gpt.data import describe_dataset
    from gpt.data.sources import write_shard
    for name, n in (("x_val_000000.bin", 100), ("x_train_000001.bin", 300), ("x_train_000002.bin", 200)):
        write_shard(tmp_path / name, list(range(n)))
    assert describe_dataset(str(tmp_path), None) == (f"data: train 2 shards, 500 tokens; val 1 shard, 100 tokens "
                                                     f"in {tmp_path}, GPT-2 BPE (no meta.json)")


def terminal_of_its_own(fcntl, termios):
    """In the child: the pty its controlling terminal, and SIGHUP's default action (a run under nohup, as a test
    run may be, would pass on its ignored SIGHUP, which the run keeps ignoring)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_closed_terminal_stops_the_run_with_a_checkpoint(data_dir, tmp_path):
    """The run's terminal is closed (the window, an ssh session that dropped): the kernel hangs the terminal up
    and sends SIGHUP. The run finishes its step and saves a checkpoint, though every write to the terminal
    now fails."""
    fcntl, termios = pytest.importorskip("fcntl"), pytest.importorskip("termios")
    import pty
    import select

    from gpt.checkpoint import load_checkpoint
    out = tmp_path / "out"
    terminal, tty = pty.openpty()
    args = [f"--{k}={v}" for k, v in {**TINY, "max_iters": 100000, "eval_interval": 100000}.items()]
    proc = subprocess.Popen([sys.executable, "train.py", f"--data_dir={data_dir}", f"--out_dir={out}", *args],
                            cwd=ROOT, env=ENV, stdin=tty, stdout=tty, stderr=tty, start_new_session=True,
                            preexec_fn=lambda: terminal_of_its_own(fcntl, termios))
    os.close(tty)
    shown, deadline = b"", time.time() + 120
    while len(re.findall(rb"^iter \d+:", shown, re.M)) < 4:  # what the terminal showed, read as it comes
        assert time.time() < deadline and proc.poll() is None, shown.decode(errors="replace")[-3000:]
        if select.select([terminal], [], [], 0.2)[0]:
            shown += os.read(terminal, 65536)
    os.close(terminal)  # the terminal is gone
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, read_log(out)[-3:]
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    end = read_log(out)[-1]
    assert end["kind"] == "end" and end["stopped"] and end["step"] == ckpt["iter_num"] >= 4
    assert [row["step"] for row in read_log(out) if row["kind"] == "train"] == list(range(ckpt["iter_num"]))


PRINTING = """import sys
sys.path.insert(0, sys.argv[1])
from gpt.runtime.signals import StopRequest
stop, n = StopRequest(), 0
while not stop.requested():
    print("a line the terminal shows", n)
    n += 1
open(sys.argv[2], "w").write(str(stop.exit_code))
"""


def test_a_print_that_meets_the_terminal_closed_does_not_end_the_run(tmp_path):
    """The kernel sends SIGHUP and fails every write to the hung-up terminal (EIO) at once; Python runs the
    handler only at its next bytecode. A print in between (a run prints a line a step; this one prints without
    a pause, so that it is always in between) must not end the run before the handler's stop and checkpoint."""
    fcntl, termios = pytest.importorskip("fcntl"), pytest.importorskip("termios")
    import pty
    import select
    terminal, tty = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", PRINTING, ROOT, str(tmp_path / "stopped")], cwd=ROOT, env=ENV,
                            stdin=tty, stdout=tty, stderr=tty, start_new_session=True,
                            preexec_fn=lambda: terminal_of_its_own(fcntl, termios))
    os.close(tty)
    shown, deadline = b"", time.time() + 120
    while shown.count(b"a line the terminal shows") < 1000:
        assert time.time() < deadline and proc.poll() is None, shown.decode(errors="replace")[-3000:]
        if select.select([terminal], [], [], 0.2)[0]:
            shown += os.read(terminal, 65536)
    os.close(terminal)
    assert proc.wait(timeout=60) == 0 and (tmp_path / "stopped").read_text() == str(128 + signal.SIGHUP)


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP (Windows)")
def test_a_second_hangup_is_no_second_request_and_nohup_is_kept(capsys):
    from gpt.runtime.signals import StopRequest
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command
        StopRequest()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        stop = StopRequest()
        for _ in range(2):  # one closed terminal: the shell passes its SIGHUP on, the kernel sends its own
            os.kill(os.getpid(), signal.SIGHUP)
        assert stop.requested() and stop.exit_code == 128 + signal.SIGHUP  # still here, to checkpoint
        assert "SIGHUP received (the terminal closed?): finishing this step" in capsys.readouterr().out
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_the_start_echoes_what_was_set_where_in_a_few_lines_and_the_log_keeps_every_setting(data_dir, tmp_path):
    """nanoGPT echoes the overrides: here one line for the config file and one for the flags, each setting that
    differs from its default under the file or flag that gave it its value, then the `config:` line of what the
    run plan decided (the whole config is log.jsonl's plan row)."""
    from conftest import train_settings
    cfg = tmp_path / "tiny_config.py"
    cfg.write_text("n_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 16\nlearning_rate = 1e-2\ncompile = True\n"
                   "warmup_iters = 1\nlr_decay_iters = 2\n")
    out = tmp_path / "out"
    flags = ["--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=2", "--compile=False",
             "--device=cpu", "--dataset=tiny", f"--data_dir={data_dir}", f"--out_dir={out}", "--learning_rate=5e-3",
             "--max_iters=2e0"]  # 2e0: an integral float is a whole number of steps
    r = subprocess.run([sys.executable, "train.py", str(cfg), *flags], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [line for line in r.stdout.splitlines() if line.startswith("config")]
    assert said == [
        f"config from {cfg}: n_layer=1 n_head=2 n_embd=32 block_size=16 warmup_iters=1 lr_decay_iters=2",
        f"config from flags: batch_size=4 gradient_accumulation_steps=1 eval_iters=2 compile=False device='cpu' "
        f"dataset='tiny' data_dir='{data_dir}' out_dir='{out}' learning_rate=0.005 max_iters=2",
        f"config: dtype='float32' n_kv_head=2 mlp_hidden=128 (as the run plan decided; every setting: the plan row "
        f"of {out}/log.jsonl)"], r.stdout[:3000]
    assert f"\nnote: dataset='tiny' does nothing here: data_dir='{data_dir}' is the data trained on" in r.stdout
    plan_row = read_log(out)[0]
    assert plan_row["kind"] == "plan" and set(plan_row["settings"]) == set(train_settings())
    assert plan_row["settings"]["learning_rate"] == 5e-3 and plan_row["settings"]["max_iters"] == 2
    assert [row["step"] for row in read_log(out) if row["kind"] == "train"] == [0, 1]
