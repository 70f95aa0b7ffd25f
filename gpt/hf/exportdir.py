"""The folder export.py writes: never over a user's files, never left half written
(docs/export.md#where-it-goes-never-over-your-files).

    check(export_dir, force, keep)        # before the checkpoint is read: one error line for any problem
    check_space(export_dir, nbytes)       # before anything is written
    with writing(export_dir) as folder:   # a new folder beside export_dir; in place only when the block succeeds
        ...
"""
import errno
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path

from gpt.runtime.errors import UserError
from gpt.runtime.files import atomic_write, give_files_their_mode, nearest_existing, new_folder

MARKER = "nanogpt_export.json"
HASHED_UP_TO = 64 << 20  # bytes: larger files (the weights) are recognised by their size, not read again
SLACK = 16 << 20  # bytes the space check adds to the weights': tokenizer, configs, model card
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


def _fingerprint(path):
    size = os.path.getsize(path)
    if size > HASHED_UP_TO:
        return {"bytes": size}
    return {"bytes": size, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}


def not_ours(folder):
    """The entries of a folder that no earlier export wrote, each with why where that is not plain."""
    recorded, strangers = {}, []
    with suppress(OSError, ValueError, KeyError, TypeError):  # {file name: fingerprint} from MARKER, if ours
        files = json.loads(Path(folder, MARKER).read_text(encoding="utf-8"))["files"]
        recorded = files if isinstance(files, dict) else {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name == MARKER and recorded:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            strangers.append(f"{name}/")
        elif name not in recorded or os.path.islink(path):
            strangers.append(name)
        elif _fingerprint(path) != recorded[name]:
            strangers.append(f"{name} (changed since export.py wrote it)")
    return strangers


def _listing(names, most=5):
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check(export_dir, force=False, keep=()):
    """One UserError line if export_dir cannot take an export (docs/export.md#where-it-goes-never-over-your-files);
    `keep`: paths that even force never replaces (the checkpoint being exported, the working directory)."""
    path = os.path.abspath(export_dir)
    if os.path.islink(export_dir):
        raise UserError(f"export_dir {export_dir} is a symbolic link: give the folder it points to, "
                        f"{os.path.realpath(export_dir)}, or a new --export_dir")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"export_dir {export_dir} is a file, not a folder: choose a new --export_dir")
    ancestor = nearest_existing(os.path.dirname(path))
    if not os.path.isdir(ancestor):
        raise UserError(f"cannot create export_dir {export_dir}: {ancestor} is a file, not a folder; choose "
                        f"a new --export_dir")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot write export_dir {export_dir}: {ancestor} is read-only (the folder or its "
                        f"disk); choose a new --export_dir")
    if not os.path.isdir(path):
        return
    for kept in keep:
        if os.path.commonpath([os.path.abspath(kept), path]) == path:
            raise UserError(f"export_dir {export_dir} holds {kept}, which replacing the folder would delete: "
                            f"choose a new --export_dir")
    strangers = not_ours(path)
    folders = [name for name in strangers if name.endswith("/")]
    if force and folders:
        raise UserError(f"export_dir {export_dir} holds folders ({_listing(folders)}), and an export never "
                        f"does: --force=True replaces only a folder of files; choose a new --export_dir")
    if strangers and not force:
        raise UserError(f"export_dir {export_dir} holds files export.py did not write ({_listing(strangers)}): "
                        f"choose a new --export_dir, or pass --force=True to replace the folder and all in it")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cannot replace export_dir {export_dir}: the folder is read-only; choose a new --export_dir")


def check_space(export_dir, nbytes):
    """One UserError line if export_dir's disk has no room for nbytes of weights and the rest, old folder included."""
    disk = nearest_existing(os.path.dirname(os.path.abspath(export_dir)))
    free, need = shutil.disk_usage(disk).free, nbytes + SLACK
    if free < need:
        raise UserError(f"no space for export_dir {export_dir}: the export needs about {need / 2**20:,.0f} MiB "
                        f"and {disk}'s disk has {free / 2**20:,.0f} MiB free; free some, or choose another "
                        f"--export_dir (--dtype=bfloat16 halves the weights)")


def _swap(new, path):
    """Put the folder `new` at `path`, replacing what is there; on a failure `path` keeps what it held."""
    if not os.path.lexists(path):
        os.rename(new, path)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.replaced-", dir=os.path.dirname(path))
    os.rmdir(old)  # wanted: a unique name beside it, free for the rename
    os.rename(path, old)
    try:
        os.rename(new, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def writing(export_dir):
    """`with writing(export_dir) as folder:` the export goes into `folder`, a new_folder beside export_dir, which
    replaces it (MARKER added) once the block succeeds, else is removed; a failure to write is one UserError line."""
    path = os.path.abspath(export_dir)
    parent, made, folder = os.path.dirname(path), [], None
    try:
        while not os.path.lexists(parent):  # each missing parent, outermost first
            made.insert(0, parent)
            parent = os.path.dirname(parent)
        for d in made:
            os.mkdir(d)
        folder = new_folder(path)
        yield folder
        give_files_their_mode(folder)  # safetensors makes the weights private; every file as open() makes it
        files = {name: _fingerprint(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
        with atomic_write(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
            json.dump({"written_by": "export.py", "files": files}, f, indent=1)
            f.write("\n")
        _swap(folder, path)
    except BaseException as e:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        for d in reversed(made):
            with suppress(OSError):
                os.rmdir(d)
        if isinstance(e, OSError) and e.errno in WRITE_ERRORS:
            raise UserError(f"cannot write export_dir {export_dir}: {e.strerror} ({e.filename or path}); "
                            f"nothing was changed there") from None
        raise
