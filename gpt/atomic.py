"""
Atomic file writes: write to a temporary name in the same folder, fsync, then rename.
A crash, a kill -9 or a full disk in the middle of a write leaves the old file (or no file),
never a valid-looking half file.
"""
import os
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_write(path, mode="wb", before_replace=None):
    """`with atomic_write(path) as f: f.write(...)` - the file appears at `path` only when complete."""
    with atomic_path(path, before_replace) as tmp:
        with open(tmp, mode) as f:
            yield f


@contextmanager
def atomic_path(path, before_replace=None):
    """`with atomic_path(path) as tmp: ...` for writers that need a file name rather than a file object
    (np.memmap): whatever is written to `tmp` is fsynced and appears at `path` only when the block ends
    without an error; on an error `tmp` is removed. before_replace(), if given, runs just before the
    rename and may raise to call it off (a last check that `path` is still ours to replace)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        try:
            yield tmp
            os.fsync(fd)  # through mkstemp's descriptor: the writer's own may be closed by now (a memmap's is)
        finally:
            os.close(fd)  # before the rename, which Windows refuses for an open file
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the permissions open() would
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    # make the rename itself durable
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # some file systems (and Windows) cannot fsync a folder; the rename is still atomic
