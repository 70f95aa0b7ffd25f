"""
A run never writes its own files through a link: a symbolic link at run.lock, log.jsonl or a checkpoint in
out_dir is refused in one line naming it, before the run changes anything, and what it points to is left as
it was. (The parts: tests/test_rundir.py, test_trainlog.py and test_atomic.py.)
"""
import os
import subprocess
import sys

from conftest import ROOT, flags, tiny, write_ids_dataset


def test_train_py_refuses_links_where_it_would_write_and_touches_nothing(tmp_path):
    data = write_ids_dataset(tmp_path / "data", [i % 16 for i in range(2000)], "abcdefghijklmnop", val=0.25)
    out = tmp_path / "out"
    out.mkdir()
    dotfile, notes = tmp_path / ".bashrc", tmp_path / "notes.txt"
    dotfile.write_text("export PATH\n")
    notes.write_text("my notes\n")
    (out / "run.lock").symlink_to(dotfile)
    (out / "log.jsonl").symlink_to(notes)
    r = subprocess.run([sys.executable, "train.py", f"--data_dir={data}", "--dataset=tiny", f"--out_dir={out}",
                        *flags(**tiny(max_iters=2))], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {out / 'log.jsonl'} (a link to {notes}), {out / 'run.lock'} (a link to "
                           f"{dotfile}): a run writes its own files in out_dir, never through a link"), line
    assert dotfile.read_text() == "export PATH\n" and notes.read_text() == "my notes\n"
    assert sorted(os.listdir(out)) == ["log.jsonl", "run.lock"] and os.path.islink(out / "run.lock")
