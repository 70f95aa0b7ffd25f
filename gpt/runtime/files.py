"""
Atomic file writes: write to a new temporary file in the same folder, fsync, then rename over `path`.
A crash, a kill -9 or a full disk mid-write leaves the old file (or none), never a valid-looking half file.
Never through a link: mkstemp makes the temporary file new (O_EXCL), its mode is set through its descriptor,
and the rename replaces whatever is at `path` (a symbolic link, one name of a hard-linked file) without
touching the file that link pointed to.
"""
import os
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_write(path, mode="wb", before_replace=None):
    """`with atomic_write(path) as f: f.write(...)` - the file appears at `path` only when complete."""
    with _temporary(path, before_replace) as (fd, _):
        with os.fdopen(os.dup(fd), mode) as f:  # the file mkstemp made, not whatever is at its name now
            yield f


@contextmanager
def atomic_path(path, before_replace=None):
    """`with atomic_path(path) as tmp: ...` for writers that need a file name (np.memmap): `tmp` appears at
    `path` when the block ends without an error, and is removed otherwise. before_replace() runs just before
    the rename and may raise to call it off (a last check that `path` is still ours to replace)."""
    with _temporary(path, before_replace) as (_, tmp):
        yield tmp


@contextmanager
def _temporary(path, before_replace):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        try:
            yield fd, tmp
            os.fsync(fd)  # through mkstemp's descriptor: the writer's own may be closed by now (a memmap's is)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes the file private; give it the mode open() would
        finally:
            os.close(fd)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # some file systems cannot fsync a folder; the rename is still atomic


def nearest_existing(path):
    """path, or the nearest folder above it that exists."""
    path = os.path.abspath(path) if not os.path.lexists(path) else path
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path
