"""
The run's folder, out_dir: writable, held by one run at a time, and never shared by two runs' files.

- A lock, out_dir/run.lock, is held for the life of the run (rank 0 alone under torchrun): a second run into
  the folder is refused in one line naming the first's PID and host. The lock is flock(2), which the kernel
  drops when its process dies, however it dies; the file holds the holder's PID and host and is removed at
  a clean exit, so a run that finds it there, unlocked, says it takes over from one that died.
  On NFS, Linux turns flock into an NFS byte-range lock that other clients see (NFSv4, or v3 with lockd);
  a mount with `nolock` or `local_lock=all` keeps locks on one machine, and then only runs on the same
  node are kept apart.
- A new run (not init_from=resume) into a folder holding an earlier run's log or checkpoints moves them into
  out_dir/earlier-<date>-<time>/ first, saying so: nothing of the earlier run is mixed in or deleted, and it
  can still be resumed from there.
"""
import atexit
import datetime
import errno
import os
import socket
import tempfile

from gpt.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

LOCK_NAME = "run.lock"
# what belongs to a run: its log and checkpoints (ckpt-<iter>.pt, ckpt-tok....pt, fsdp's ckpt_dcp/)
RUN_FILES = ("log.jsonl", "ckpt.pt", "ckpt_dcp", "ckpt_dcp.old")
_held = None  # (descriptor, path) of the lock file, open and locked until the process ends


def claim(out_dir, fresh):
    """Make out_dir ready for a run, before any other use of it: writable, locked, and (fresh: a new run,
    not a resumed one) cleared of an earlier run's files, which are kept aside."""
    check_writable(out_dir)
    hold(out_dir)
    if fresh:
        set_aside(out_dir)


def check(out_dir, fresh):
    """Before any side effect: out_dir can be written (or made) and no live run holds it. Creates nothing."""
    parent = out_dir
    while not os.path.exists(parent):  # the nearest folder that exists is where out_dir would be made
        parent = os.path.dirname(os.path.abspath(parent))
    if not os.path.isdir(parent):
        raise UserError(f"out_dir {out_dir} cannot be made: {parent} is a file, not a folder: choose another --out_dir")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"out_dir {out_dir} is not writable ({parent}: permission denied): choose another --out_dir")
    del fresh


def check_writable(out_dir):
    """Fail before training, not at the first save, when checkpoints cannot be written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise UserError(f"out_dir {out_dir} is not writable ({e.strerror or e}): choose another --out_dir")


def hold(out_dir):
    """Lock out_dir for this process's life; one line if another live run holds it."""
    global _held
    if fcntl is None:
        return
    path = os.path.join(out_dir, LOCK_NAME)
    while True:  # plain file descriptors: nothing buffered that a full disk could fail to flush at exit
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.read(fd, 1000).decode(errors="replace").strip()
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"out_dir {out_dir} is in use by another run ({holder or 'just starting'}; lock "
                                f"{path}): wait for it to end, stop it, or choose another --out_dir")
            print(f"note: cannot lock {path} ({e.strerror or e}): nothing keeps a second run out of {out_dir}")
            return
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break  # the file at `path`, not one that a run which just ended had removed
        except FileNotFoundError:
            pass
        os.close(fd)
    previous = os.read(fd, 1000).decode(errors="replace").strip()
    if previous:
        print(f"note: taking over {path} from a run that ended without releasing it ({previous})")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} on host {socket.gethostname()}, since "
                      f"{datetime.datetime.now().isoformat(timespec='seconds')}\n".encode(), 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, without the holder's name
    _held = (fd, path)
    atexit.register(release)


def release():
    """A clean end: remove the lock file, then let go of the lock (a run that opened the file meanwhile
    sees that it is no longer at its path, and tries again)."""
    global _held
    if _held is not None:
        fd, path = _held
        try:
            os.remove(path)
        except OSError:
            pass
        os.close(fd)  # closing drops the flock
        _held = None


def earlier_run(out_dir):
    """The names of an earlier run's files in out_dir."""
    return sorted(f for f in os.listdir(out_dir) if f in RUN_FILES or (f.startswith("ckpt-") and f.endswith(".pt")))


def set_aside(out_dir):
    """Move an earlier run's files into out_dir/earlier-<date>-<time>/, saying so."""
    names = earlier_run(out_dir)
    if not names:
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    dest, n = os.path.join(out_dir, f"earlier-{stamp}"), 1
    while os.path.exists(dest):
        n += 1
        dest = os.path.join(out_dir, f"earlier-{stamp}-{n}")
    try:
        os.makedirs(dest)
        for name in names:
            os.rename(os.path.join(out_dir, name), os.path.join(dest, name))
    except OSError as e:
        raise UserError(f"out_dir {out_dir} holds an earlier run ({', '.join(names)}) that could not be moved "
                        f"aside to {dest} ({e.strerror or e}): choose another --out_dir, or resume it with "
                        f"--init_from=resume")
    print(f"note: {out_dir} held an earlier run; its {', '.join(names)} are kept in {dest} (this is a new run: "
          f"to continue that one instead, use --init_from=resume --out_dir={dest})")
    return dest
