"""
Atomic file writes: write to a temporary name in the same folder, fsync, then rename.
A crash, a kill -9 or a full disk in the middle of a write leaves the old file (or no file),
never a valid-looking half file.
"""
import os
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_write(path, mode="wb"):
    """`with atomic_write(path) as f: f.write(...)` - the file appears at `path` only when complete."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the permissions open() would
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
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
