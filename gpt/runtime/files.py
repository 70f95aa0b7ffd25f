"""
Atomic file writes: write to a temporary name in the same folder, fsync, then rename.
A crash, a kill -9 or a full disk in the middle of a write leaves the old file (or no file),
never a valid-looking half file.

Never through a link: the temporary file is made new (mkstemp: O_CREAT | O_EXCL, and O_NOFOLLOW where the
system has it), so no file or link already at its name is opened; its permissions are set through its
descriptor, not its name; and the rename replaces whatever is at `path` - a symbolic link or one name of a
hard-linked file - leaving the file that link pointed to (or the other names) as they were.
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
    """`with atomic_path(path) as tmp: ...` for writers that need a file name rather than a file object
    (np.memmap): whatever is written to `tmp` is fsynced and appears at `path` only when the block ends
    without an error; on an error `tmp` is removed. before_replace(), if given, runs just before the
    rename and may raise to call it off (a last check that `path` is still ours to replace)."""
    with _temporary(path, before_replace) as (_, tmp):
        yield tmp


@contextmanager
def _temporary(path, before_replace):
    """The temporary file beside `path` as (descriptor, name), put in its place when the block ends well."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        try:
            yield fd, tmp
            os.fsync(fd)  # through mkstemp's descriptor: the writer's own may be closed by now (a memmap's is)
            set_mode(fd, tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the mode open() would
        finally:
            os.close(fd)  # before the rename, which Windows refuses for an open file
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
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


def set_mode(fd, path, mode):
    """chmod through the descriptor where the system can (by name, a link put there meanwhile would be
    followed); Windows has no fchmod, nor links a user makes without privileges."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:
        os.chmod(path, mode)


def nearest_existing(path):
    """path, or the nearest folder above it that exists."""
    path = os.path.abspath(path) if not os.path.lexists(path) else path
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path
