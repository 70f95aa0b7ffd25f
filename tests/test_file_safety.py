"""
No file is ever written through a link. A run refuses a symbolic link at run.lock, log.jsonl or a checkpoint
in out_dir in one line naming it, before the run changes anything, and what it points to is left as it was
(the parts: tests/test_rundir.py, test_trainlog.py and test_atomic.py). Every other writer (plot.py, bench.py's
JSON and profile, export.py, the prepare scripts) replaces a link at its output with the new file: the scan
below finds any write in the shipped code that does not go through gpt/runtime/files.py, and each
user-facing writer is run with links at its outputs. The dashboard writes nothing.
"""
import ast
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, flags, run, tiny, write_ids_dataset


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


# --- every writer of the project: one rule (gpt/runtime/files.py), found by reading the code

# calls that write a file at a path (or open one for writing), by the called name; `save`, `copy`, `move` only
# on these modules (a project object's .save goes through its own writer, which this scan reads too)
PATH_WRITERS = {"savefig", "tofile", "save_file", "save_pretrained", "export_chrome_trace", "write_text",
                "write_bytes", "savez", "savez_compressed", "savetxt", "urlretrieve"}
MODULE_WRITERS = {"save", "copy", "copyfile", "copy2", "copytree", "move"}
SAVE_MODULES = {"torch", "np", "numpy", "dcp", "shutil", "pickle"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
HELPERS = {"atomic_write", "writing"}  # gpt/runtime/files.py's; exportdir.writing is its new_folder
# writers that follow the rule in a way the scan cannot see, each with how: (file, function) -> why
FOLLOW_THE_RULE_ELSEWHERE = {
    ("gpt/hf/tokenizer.py", "save_tokenizer"): "export.py calls it only with exportdir.writing's new folder",
    ("gpt/checkpoint/sharded.py", "save_sharded"): "every rank writes into ckpt_dcp.tmp, one fixed name all ranks "
                                                    "share, where rundir.check_no_links refuses a link before each "
                                                    "save; the folder is then renamed into place",
}


def shipped_python():
    out = subprocess.run(["git", "ls-files", "*.py", ":!tests", ":!dev"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    assert "plot.py" in out and "gpt/runtime/files.py" in out, out
    return out


def names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def writes(call):
    """Whether a call writes a file: open()/os.open for writing, np.memmap in a writing mode, a library writer."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), call.args[1] if len(call.args) > 1 else None)
    if mode is None and call.args and isinstance(call.args[0], ast.Constant) and re.fullmatch(
            r"[rwxabt+]+", str(call.args[0].value)):
        mode = call.args[0]  # a pathlib.Path's open("w")
    if name == "open" and owner == "os":
        return len(call.args) < 2 or bool(names_in(call.args[1]) - {"os", "O_RDONLY", "O_NOFOLLOW", "O_CLOEXEC"})
    if name in ("open", "memmap"):
        if mode is None:
            return False  # read: open()'s and memmap's default modes
        return not isinstance(mode, ast.Constant) or any(c in str(mode.value) for c in "wax+") or mode.value in (
            "readwrite", "write")
    return name in PATH_WRITERS or (name in MODULE_WRITERS and owner in SAVE_MODULES)


def follows_the_rule(call, helper_names):
    """Through a helper (the call names what an enclosing `with atomic_write(...) as f` bound), or an os.open
    that refuses a link (O_NOFOLLOW), or os.devnull."""
    if names_in(call) & helper_names:
        return True
    if isinstance(call.func, ast.Attribute) and call.func.attr == "open" and len(call.args) > 1 and (
            "NOFOLLOW" in " ".join(names_in(call.args[1]))):
        return True
    return bool(call.args) and "devnull" in names_in(call.args[0])


def unruly_writers(source, path):
    """(line, code, function) of each write call in source that does not follow the rule."""
    tree = ast.parse(source)
    found = []

    def visit(node, function, bound):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, (ast.With, ast.AsyncWith)):
            bound = bound | {n for item in node.items if isinstance(item.context_expr, ast.Call)
                             and (getattr(item.context_expr.func, "id", None) or
                                  getattr(item.context_expr.func, "attr", None)) in HELPERS
                             and item.optional_vars is not None for n in names_in(item.optional_vars)}
        if isinstance(node, ast.Call) and writes(node) and not follows_the_rule(node, bound) and (
                (path, function) not in FOLLOW_THE_RULE_ELSEWHERE):
            found.append((node.lineno, ast.unparse(node)[:100], function))
        for child in ast.iter_child_nodes(node):
            visit(child, function, bound)

    visit(tree, "<module>", frozenset())
    return found


def test_the_scan_finds_a_writer_that_goes_around_the_helper():
    # the scan itself, on writers as they would be added: each must be found, and the rule's forms must pass
    bad = ['open(p, "w")', 'open(p, mode="ab")', 'open(p, m)', 'Path(p).open("w")', 'np.memmap(p, mode="w+")',
           'fig.savefig("x.png")', 'torch.save(x, p)', 'np.save(p, a)', 'a.tofile(p)', 'm.save_pretrained(d)',
           'save_file(sd, p)', 'prof.export_chrome_trace(p)', 'Path(p).write_text(s)', 'shutil.copy(a, p)',
           'os.open(p, os.O_WRONLY | os.O_CREAT)', 'dcp.save(sd, checkpoint_id=p)',
           'shutil.copyfile(a, p)', 'with atomic_write(p) as f:\n    open(q, "w")']
    for code in bad:
        assert unruly_writers(code, "new.py"), code
    good = ['open(p)', 'open(p, "rb")', 'np.memmap(p, dtype=d, mode="r")', 'os.open(p, os.O_RDONLY)',
            'with atomic_write(p) as f:\n    torch.save(x, f)',
            'with atomic_write(p) as f:\n    fig.savefig(f, format="png")', 'os.open(p, flags | NOFOLLOW, 0o644)',
            'open(os.devnull, "w")', 'with exportdir.writing(d) as folder:\n    m.save_pretrained(folder)',
            'saver.save(model)', 'json.dump(x, f)', 'rundir.move(a, b, name)']
    for code in good:
        assert not unruly_writers(code, "new.py"), code


def test_every_shipped_writer_goes_through_the_helper():
    """Every call in the shipped code that writes a file (open for writing, np.memmap w+, torch.save, savefig,
    save_pretrained, save_file, a profiler trace, write_text, ...) writes through gpt/runtime/files.py's
    atomic_write/new_folder, or opens with O_NOFOLLOW (the appended log): a writer added later
    that writes through a link fails here, naming its line."""
    found = []
    for path in shipped_python():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            found += [f"{path}:{line} in {function}: {code}" for line, code, function in
                      unruly_writers(f.read(), path)]
    assert not found, "write through gpt/runtime/files.py's atomic_write:\n" + "\n".join(found)
    for path, function in FOLLOW_THE_RULE_ELSEWHERE:  # each exception still names a writer that exists
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert f"def {function}(" in f.read(), (path, function)


@pytest.fixture
def outside(tmp_path):
    """A file outside every output folder, that links at the outputs point to: it must never change."""
    path = tmp_path / "precious.txt"
    path.write_bytes(b"keep me\n")
    return path


def link(path, target):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def untouched(outside, *replaced):
    assert outside.read_bytes() == b"keep me\n"
    for path in replaced:  # the link itself replaced by the new file
        assert os.path.isfile(path) and not os.path.islink(path), path


@pytest.mark.needs("matplotlib")
def test_plot_replaces_a_link_at_its_output(tmp_path, outside):
    from test_plot import png_size, write_log
    write_log(tmp_path / "run")
    link(tmp_path / "run" / "curves.png", outside)
    run("plot.py", f"--out_dir={tmp_path / 'run'}")
    untouched(outside, tmp_path / "run" / "curves.png")
    assert png_size(tmp_path / "run" / "curves.png") == (1200, 1200)
    link(tmp_path / "svg" / "run.svg", outside)
    run("plot.py", f"--out_dir={tmp_path / 'run'}", f"--output={tmp_path / 'svg' / 'run.svg'}")
    untouched(outside, tmp_path / "svg" / "run.svg")
    assert (tmp_path / "svg" / "run.svg").read_text().lstrip().startswith("<?xml")


BENCH = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
         "--vocab_size=64", "--batch_sizes=2", "--gen_batch_sizes=1", "--gen_tokens=4", "--warmup_steps=1",
         "--timed_steps=1", "--check_batch_size=0"]


def test_bench_replaces_links_at_its_json_and_profile(tmp_path, outside):
    out = tmp_path / "bench.json"
    link(out, outside)
    link(tmp_path / "bench_profile_B2.txt", outside)
    run("bench.py", *BENCH, "--profile=True", f"--out_json={out}")
    untouched(outside, out, tmp_path / "bench_profile_B2.txt")
    assert json.loads(out.read_text())["train"][0]["batch_size"] == 2


@pytest.mark.needs("transformers")
def test_export_replaces_links_in_the_folder_it_replaces_and_writes_files_as_open_would(tmp_path, outside):
    import torch

    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=40))
    meta = {"tokenizer": "char", "vocab_size": 39, "dtype": "uint16", "itos": [chr(c) for c in range(65, 104)]}
    (tmp_path / "out").mkdir()
    torch.save({"model": model.state_dict(), "model_args": model.config.checkpoint_args(), "iter_num": 1,
                "best_val_loss": 3.0, "config": {}, "dataset_meta": meta}, tmp_path / "out" / "ckpt.pt")
    export_dir = tmp_path / "hf"
    export = ["export.py", f"--out_dir={tmp_path / 'out'}", f"--export_dir={export_dir}", "--verify=False"]
    run(*export)
    os.remove(export_dir / "model.safetensors")
    os.symlink(outside, export_dir / "model.safetensors")  # a link where the weights were: replaced with the rest
    run(*export, "--force=True")
    untouched(outside, export_dir / "model.safetensors")
    umask = os.umask(0)
    os.umask(umask)
    modes = {name: oct(os.stat(export_dir / name).st_mode & 0o777) for name in os.listdir(export_dir)}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes  # the weights too: safetensors makes them 0600


def test_prepare_replaces_links_at_its_outputs(tmp_path, outside, corpus_path):
    out = tmp_path / "data"
    for name in ("train.bin", "val.bin", "meta.json"):
        link(out / name, outside)
    run("data/shakespeare_char/prepare.py", "--input", corpus_path, "--out_dir", out)
    untouched(outside, *(out / name for name in ("train.bin", "val.bin", "meta.json")))


@pytest.mark.needs("datasets")
def test_prepare_streaming_replaces_links_at_its_outputs_and_scratch_files(tmp_path, outside, gpt2_ranks_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * (i % 5 + 1)}) + "\n" for i in range(20)))
    out = tmp_path / "data"
    for name in ("train.bin", "val.bin", "meta.json", "documents.tmp"):
        link(out / name, outside)
    run("data/openwebtext/prepare.py", "--local", src, "--streaming", "--num_proc=1", "--val_fraction=0.1",
        "--out_dir", out)
    untouched(outside, *(out / name for name in ("train.bin", "val.bin", "meta.json")))
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_the_log_refuses_a_link_in_one_line(tmp_path, outside, capsys):
    from gpt.monitor.trainlog import TrainLog
    link(tmp_path / "log.jsonl", outside)
    TrainLog(tmp_path).write(kind="train", step=0)
    assert capsys.readouterr().out.splitlines() == [
        f"error: could not write to {tmp_path / 'log.jsonl'} (it is a symbolic link, which a run never writes "
        f"through): rows are lost until it can"]
    untouched(outside)
