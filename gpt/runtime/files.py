"""The one rule for every file the project writes (docs/checkpoints.md#links): write to a new temporary file in
the same folder, fsync, then rename over `path`, so that a crash leaves the old file, never a half one. Never
through a link: mkstemp makes the file new (O_EXCL), and the rename replaces a link without touching its target.

    atomic_write(path)      a file object (torch.save, json.dump, savefig(f, format=...))
    new_folder(path)        a new folder beside `path`, for writers of whole folders (save_pretrained)

The appended log.jsonl is opened with O_NOFOLLOW instead (gpt/monitor/trainlog.py)."""
import os
import tempfile
from contextlib import contextmanager, suppress


@contextmanager
def atomic_write(path, mode="wb", before_replace=None, encoding=None):
    """`with atomic_write(path) as f: f.write(...)` - the file appears at `path` only when complete."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        try:
            # the file mkstemp made, not whatever is at its name now
            with os.fdopen(os.dup(fd), mode, encoding=encoding) as f:
                yield f
            os.fsync(fd)  # through mkstemp's descriptor: the writer's own may be closed by now (a memmap's is)
            os.fchmod(fd, file_mode())  # mkstemp makes the file private; give it the mode open() would
        finally:
            os.close(fd)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise
    with suppress(OSError):  # the rename made durable, where the file system can fsync a folder
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def file_mode(folder=False):
    """The mode open() (or, folder=True, mkdir) gives a new file under the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


def new_folder(path):
    """A new, empty folder beside `path` (hidden, named after it), with the mode mkdir would give: whatever
    is written into it is new, never through a link, until the caller renames the folder into place."""
    folder = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path))
    os.chmod(folder, file_mode(folder=True))  # mkdtemp makes it private
    return folder


def give_files_their_mode(folder):
    """Every file in `folder` gets the mode open() would give it: some writers (safetensors) make theirs private."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and not os.path.islink(path):
            os.chmod(path, file_mode())


def nearest_existing(path):
    path = os.path.abspath(path) if not os.path.lexists(path) else path
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path
