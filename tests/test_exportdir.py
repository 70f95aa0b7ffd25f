"""
gpt/hf/exportdir.py, through export.py: an export never overwrites a folder that holds anything but an earlier
export (--force=True replaces it), every export_dir problem is one error line before anything is written, and
a failed export leaves what was there whole.
"""
import errno
import json
import os

import pytest
import torch
from conftest import run

import export
from gpt.hf import exportdir
from gpt.runtime.errors import UserError
from model import GPT, GPTConfig

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def out(tmp_path):
    """A run folder holding a tiny character model's ckpt.pt."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=40))
    chars = [chr(c) for c in range(65, 65 + 39)]
    meta = {"tokenizer": "char", "vocab_size": 39, "dtype": "uint16", "itos": chars}
    d = tmp_path / "out"
    d.mkdir()
    torch.save({"model": model.state_dict(), "model_args": model.config.checkpoint_args(), "iter_num": 1,
                "best_val_loss": 3.0, "config": {}, "dataset_meta": meta}, d / "ckpt.pt")
    return d


def export_to(out, export_dir, *flags):
    export.main([f"--out_dir={out}", f"--export_dir={export_dir}", "--verify=False", *flags])


def tree(folder):
    """{relative path: bytes} of every file under folder, and each folder as None: what is on disk."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), folder)] = None
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                found[os.path.relpath(os.path.join(root, name), folder)] = f.read()
    return found


def one_line(e):
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_an_earlier_export_is_recognised_and_replaced(out, tmp_path):
    folder = tmp_path / "hf"
    export_to(out, folder)
    marker = json.loads((folder / exportdir.MARKER).read_text())
    assert set(marker["files"]) == set(os.listdir(folder)) - {exportdir.MARKER}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(marker["files"])
    os.mkdir(tmp_path / "made_by_mkdir")  # the export folder has the permissions a plain mkdir gives
    assert os.stat(folder).st_mode == os.stat(tmp_path / "made_by_mkdir").st_mode
    before = tree(folder)
    export_to(out, folder)  # over an earlier export: no --force needed
    assert tree(folder) == before
    assert sorted(os.listdir(tmp_path)) == ["hf", "made_by_mkdir", "out"]  # no temporary folder left beside


def test_a_folder_holding_a_users_file_is_refused_and_replaced_only_with_force(out, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text('{"mine": true}')
    with pytest.raises(UserError) as e:
        export_to(out, folder)
    assert one_line(e) == (f"export_dir {folder} holds files export.py did not write (config.json): choose a new "
                           f"--export_dir, or pass --force=True to replace the folder and all in it")
    assert tree(folder) == {"config.json": b'{"mine": true}'}
    export_to(out, folder, "--force=True")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gpt2"
    assert exportdir.not_ours(folder) == []


def test_an_export_with_a_file_added_or_changed_is_no_longer_only_ours(out, tmp_path):
    folder = tmp_path / "hf"
    export_to(out, folder)
    (folder / "notes.txt").write_text("my notes")
    with pytest.raises(UserError, match=r"holds files export.py did not write \(notes.txt\)"):
        export_to(out, folder)
    os.remove(folder / "notes.txt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 7}))
    before = tree(folder)
    with pytest.raises(UserError) as e:
        export_to(out, folder)
    assert "(config.json (changed since export.py wrote it))" in one_line(e)
    assert tree(folder) == before
    os.remove(folder / exportdir.MARKER)  # an export without its marker (one made before it was written)
    with pytest.raises(UserError, match="did not write"):
        export_to(out, folder)


@pytest.mark.parametrize("case, expected", [
    ("file", "export_dir {dir} is a file, not a folder: choose a new --export_dir"),
    ("parent is a file", "cannot create export_dir {dir}: {tmp}/plain is a file, not a folder; choose a new "
                         "--export_dir"),
    ("link", "export_dir {dir} is a symbolic link: give the folder it points to, {tmp}/elsewhere, or a new "
             "--export_dir"),
    ("the run folder", "export_dir {dir} holds {tmp}/out/ckpt.pt, which replacing the folder would delete: "
                       "choose a new --export_dir"),
    ("holds a folder", "export_dir {dir} holds folders (sub/), and an export never does: --force=True replaces "
                       "only a folder of files; choose a new --export_dir"),
])
def test_export_dir_problems_are_one_line_before_anything_is_written(case, expected, out, tmp_path):
    (tmp_path / "plain").write_text("a file")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "sub").mkdir()
    export_dir = {"file": tmp_path / "plain", "parent is a file": tmp_path / "plain" / "hf",
                  "link": tmp_path / "link", "the run folder": out, "holds a folder": tmp_path / "full"}[case]
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    before = tree(tmp_path)
    with pytest.raises(UserError) as e:
        export_to(out, export_dir, "--force=True")
    assert one_line(e) == expected.format(dir=export_dir, tmp=tmp_path)
    assert tree(tmp_path) == before


def test_a_read_only_parent_is_one_line(out, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user (root) writes into read-only folders, so nothing here is read-only to it")
        with pytest.raises(UserError) as e:
            export_to(out, locked / "new" / "hf")
        assert one_line(e) == (f"cannot write export_dir {locked / 'new' / 'hf'}: {locked} is read-only (the "
                               f"folder or its disk); choose a new --export_dir")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_too_little_space_is_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        exportdir.check_space(tmp_path / "hf", 1 << 60)
    assert one_line(e).startswith(f"no space for export_dir {tmp_path / 'hf'}: the export needs about ")
    exportdir.check_space(tmp_path / "hf", 1 << 20)  # a MiB fits


def test_a_failed_write_leaves_the_old_export_whole(out, tmp_path, monkeypatch):
    """The disk fills while the tokenizer is written: one error line, the earlier export as it was, and no
    temporary folder, nor the parents made for the new one, left behind."""
    folder = tmp_path / "hf"
    export_to(out, folder)
    before = tree(tmp_path)

    def disk_full(hf_tok, where):
        raise OSError(errno.ENOSPC, "No space left on device", os.path.join(where, "tokenizer.json"))

    monkeypatch.setattr(export, "save_tokenizer", disk_full)
    with pytest.raises(UserError) as e:
        export_to(out, folder)
    assert one_line(e).startswith(f"cannot write export_dir {folder}: No space left on device (")
    assert one_line(e).endswith("); nothing was changed there")
    with pytest.raises(UserError):
        export_to(out, tmp_path / "new" / "deeper" / "hf")
    assert tree(tmp_path) == before


def test_missing_parents_are_made(out, tmp_path):
    folder = tmp_path / "new" / "deeper" / "hf"
    export_to(out, folder)
    assert exportdir.not_ours(folder) == [] and "config.json" in os.listdir(folder)


def test_the_script_prints_one_error_line(out, tmp_path):
    (tmp_path / "plain").write_text("a file")
    r = run("export.py", f"--out_dir={out}", f"--export_dir={tmp_path / 'plain'}", check=False)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: export_dir {tmp_path / 'plain'} is a file, not a folder: choose a new --export_dir"], r.stderr
