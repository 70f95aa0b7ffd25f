"""
The run's folder, out_dir: writable, held by one run at a time, never shared by two runs' files, and never
written through a link (docs/checkpoints.md#one-run-per-out_dir). check() says what can go wrong, touching
nothing; claim() makes, locks and (a new run) clears out_dir, and returns the Claim that guards every save.
"""
import atexit
import datetime
import errno
import fcntl
import os
import re
import socket
import tempfile
import uuid

from gpt.runtime.errors import UserError
from gpt.runtime.files import nearest_existing

LOCK_NAME = "run.lock"
# what belongs to a run: its log and checkpoints (also ckpt-<iter>.pt and ckpt-tok....pt: is_run_file)
RUN_FILES = ("log.jsonl", "ckpt.pt", "ckpt_dcp", "ckpt_dcp.old")
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)  # what flock says when another process holds the lock


def check(out_dir, fresh):
    """Everything claim() needs, checked without touching the disk (a failure is one line, UserError)."""
    if os.path.islink(out_dir) and not os.path.exists(out_dir):
        raise UserError(f"out_dir {out_dir} is a link to {os.readlink(out_dir)}, which does not exist: make that "
                        f"folder, or choose another --out_dir")
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"out_dir {out_dir} is a file, not a folder: choose another --out_dir")
    existing = nearest_existing(out_dir)
    if not os.path.isdir(existing):
        raise UserError(f"out_dir {out_dir} cannot be made: {existing} is a file, not a folder: choose "
                        f"another --out_dir")
    if not os.access(existing, os.W_OK | os.X_OK):  # access(2) also says EROFS for a read-only disk
        what = "is not writable" if existing == out_dir else f"cannot be made ({existing} is not writable)"
        raise UserError(f"out_dir {out_dir} {what}: choose another --out_dir")
    if existing != out_dir:
        return  # a folder still to be made holds nothing and nobody holds it
    check_no_links(out_dir)
    holder = live_holder(out_dir)
    if holder:
        raise in_use(out_dir, holder)
    if fresh:
        stuck = [f for f in earlier_run(out_dir) if os.path.isdir(os.path.join(out_dir, f))
                 and not os.access(os.path.join(out_dir, f), os.W_OK)]  # moving a folder rewrites its '..'
        if stuck:
            raise UserError(f"out_dir {out_dir} holds an earlier run whose {', '.join(stuck)} cannot be moved aside "
                            f"(not writable): choose another --out_dir, or resume it with --init_from=resume")


def check_no_links(out_dir):
    """A UserError naming each symbolic link where the run would write a file of its own."""
    links = [os.path.join(out_dir, f) for f in sorted(os.listdir(out_dir))
             if (f in (LOCK_NAME, "ckpt_dcp.tmp") or is_run_file(f)) and os.path.islink(os.path.join(out_dir, f))]
    if links:
        named = ", ".join(f"{path} (a link to {os.readlink(path)})" for path in links)
        them = "it (what it points to" if len(links) == 1 else "them (what they point to"
        raise UserError(f"{named}: a run writes its own files in out_dir, never through a link; remove {them} "
                        f"stays as it is), or, to keep the run's files elsewhere, make out_dir itself the link")


def in_use(out_dir, holder):
    return UserError(f"out_dir {out_dir} is in use by another run ({holder}): wait for it to end, stop it, or "
                     f"choose another --out_dir")


def claim(out_dir, fresh):
    """Make out_dir ready for a run, before any other use of it: made if need be, writable, locked, and (fresh)
    cleared of an earlier run's files, which are kept aside. Returns the Claim; a failure undoes it all."""
    check(out_dir, fresh)
    held = Claim(out_dir)
    try:
        path = os.path.abspath(out_dir)
        while not os.path.lexists(path):  # the folders to make, outermost first: undo removes them again
            held.made.insert(0, path)
            path = os.path.dirname(path)
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise UserError(f"out_dir {out_dir} cannot be made ({e.strerror or e}): choose another --out_dir")
        check_writable(out_dir)
        held.hold()
        if fresh:
            held.aside = set_aside(out_dir)
    except BaseException:
        held.undo(quiet=True)
        raise
    atexit.register(held.release)
    return held


def check_writable(out_dir):
    """Fail before training, not at the first save, where access(2) says yes but a file cannot be made (a
    full disk, a quota, ACLs)."""
    try:
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise UserError(f"out_dir {out_dir} is not writable ({e.strerror or e}): choose another --out_dir")


class Claim:
    """One run's hold on out_dir: its locks, the run id written into run.lock, and what claim() changed (the
    folders it made, the earlier run's files it moved aside), undone if the run fails before it starts."""

    def __init__(self, out_dir):
        self.out_dir, self.lock_path = out_dir, os.path.join(out_dir, LOCK_NAME)
        self.run_id = uuid.uuid4().hex[:12]
        self.made, self.aside = [], None
        self.dir_fd = self.lock_fd = None
        self.folder = None  # out_dir's (device, inode) when claimed: moved or replaced later, it is not ours
        self.lock_text = b""  # what this run wrote into run.lock
        self.settled = False  # the run has started: nothing is undone

    def hold(self):
        """Take both locks, the folder's first; one line if another live run holds either."""
        st = os.stat(self.out_dir)
        self.folder = (st.st_dev, st.st_ino)
        self.dir_fd = os.open(self.out_dir, os.O_RDONLY)
        try:
            fcntl.flock(self.dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.dir_fd)
            self.dir_fd = None
            if e.errno in _BUSY:
                raise in_use(self.out_dir, holder_words(self.out_dir))
            # no folder lock here (NFS: its locks are on files); run.lock alone keeps runs apart
        self.hold_lock_file()

    def hold_lock_file(self):
        path = self.lock_path
        while True:  # until the locked file is the one at the path, and ours alone
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError:
                check_no_links(self.out_dir)  # a link made since check(): refused as check() does
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.read(fd, 1000).decode(errors="replace").strip()
                os.close(fd)
                if e.errno in _BUSY:
                    raise in_use(self.out_dir, f"{holder or 'just starting'}; lock {path}")
                print(f"note: cannot lock {path} ({e.strerror or e}): nothing keeps a second run out of "
                      f"{self.out_dir}")
                return
            try:
                st, held = os.lstat(path), os.fstat(fd)
                if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):  # not one a run that just ended removed
                    if held.st_nlink == 1:
                        break
                    os.remove(path)  # also another folder's (a `cp -al` copy): this run makes one of its own
            except FileNotFoundError:
                pass
            os.close(fd)
        previous = os.read(fd, 1000).decode(errors="replace").strip()
        if previous:
            print(f"note: taking over {path} from a run that ended without releasing it ({previous})")
        text = (f"PID {os.getpid()} on host {socket.gethostname()}, since "
                f"{datetime.datetime.now().isoformat(timespec='seconds')}, run {self.run_id}\n").encode()
        try:  # plain file descriptors: nothing buffered that a full disk could fail to flush at exit
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
            self.lock_text = text
        except OSError:
            pass  # a full disk: the lock holds all the same, without the holder's name
        self.lock_fd = fd

    def owner_problem(self):
        """Why out_dir is no longer this run's, in words, or None. Asked before every save: out_dir must be the
        folder this run claimed, and run.lock the file it locked, holding what it wrote (a new file can reuse
        the inode). A run.lock removed by hand is no problem while the folder lock holds."""
        try:
            st = os.stat(self.out_dir)
        except OSError as e:
            return f"{self.out_dir} is gone ({e.strerror or e})"
        if (st.st_dev, st.st_ino) != self.folder:
            return f"{self.out_dir} is no longer the folder this run claimed ({holder_words(self.out_dir)})"
        if self.lock_fd is None:
            return None
        try:
            st, text = os.lstat(self.lock_path), read_start(self.lock_path)
        except FileNotFoundError:
            return None if self.dir_fd is not None else (
                f"{self.lock_path} was removed, so this run cannot tell whether another run has used "
                f"{self.out_dir} since")
        held = os.fstat(self.lock_fd)
        if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino) or text != self.lock_text:
            return f"another run has claimed {self.out_dir} ({text.decode(errors='replace').strip() or 'unnamed'})"
        return None

    def settle(self):
        """The run has started (its first step is next): from now on undo() leaves everything as it is."""
        self.settled = True

    def undo(self, quiet=False):
        """Put the disk back as claim() found it, unless the run has started: the earlier run's files back (each
        whose name this run has not used meanwhile), the locks let go, the folders claim() made removed while
        empty. A second call does nothing."""
        if self.settled:
            return
        self.settled = True
        if self.aside:
            back = [name for name in sorted(os.listdir(self.aside)) if move(self.aside, self.out_dir, name)]
            try:
                os.rmdir(self.aside)
                where = f"are back in {self.out_dir}"
            except OSError:
                where = f"stay in {self.aside}"
            if not quiet:
                print(f"note: this run did not start, so the earlier run's {', '.join(back) or 'files'} {where}")
        self.release()
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty (or not ours to remove): it stays, and so do the folders above it

    def release(self):
        """A clean end: remove run.lock (never another run's), then let go of the locks (a run that opened the
        file meanwhile sees that it is no longer at its path, and tries again)."""
        if self.lock_fd is not None:
            if self.owner_problem() is None:
                try:
                    os.remove(self.lock_path)
                except OSError:
                    pass
            os.close(self.lock_fd)  # closing drops the flock
            self.lock_fd = None
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None


def move(src, dst, name):
    """Move src/name to dst/name unless dst has that name; returns whether it moved."""
    try:
        if os.path.lexists(os.path.join(dst, name)):
            return False
        os.rename(os.path.join(src, name), os.path.join(dst, name))
        return True
    except OSError:
        return False


def read_start(path):
    with open(path, "rb") as f:
        return f.read(1000)


def live_holder(out_dir):
    """Who holds out_dir (words), or None: nobody alive. Each lock is tried and at once let go."""
    lock = os.path.join(out_dir, LOCK_NAME)
    for path in (out_dir, lock):
        try:
            fd = os.open(path, os.O_RDONLY | (os.O_NOFOLLOW if path == lock else 0))
        except OSError:
            continue  # no run.lock (or a link, which check() refuses): nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as e:
            if e.errno in _BUSY:
                return holder_words(out_dir)
        finally:
            os.close(fd)
    return None


def holder_words(out_dir):
    """The live holder of out_dir, in words: what its run.lock says, else its PID from Linux's /proc/locks."""
    lock = os.path.join(out_dir, LOCK_NAME)
    try:
        text = read_start(lock).decode(errors="replace").strip()
    except OSError:
        text = ""
    if text:
        return f"{text}; lock {lock}"
    try:
        ino = os.stat(out_dir).st_ino
        with open("/proc/locks") as f:
            pids = {m.group(1) for row in f if (m := re.search(r"FLOCK\s+\S+\s+WRITE\s+(\d+)\s+\w+:\w+:(\d+)\s", row))
                    and int(m.group(2)) == ino}
    except OSError:
        pids = set()
    pid = pids.pop() if len(pids) == 1 else None
    return (f"{'PID ' + pid if pid else 'a process'} on this host holds the folder's lock; its {LOCK_NAME} was "
            f"removed")


def is_run_file(name):
    return name in RUN_FILES or (name.startswith("ckpt-") and name.endswith(".pt"))


def earlier_run(out_dir):
    """The names of an earlier run's files in out_dir."""
    return sorted(f for f in os.listdir(out_dir) if is_run_file(f))


def earlier_runs(out_dir):
    """The earlier-* folders in out_dir that hold a checkpoint (ckpt.pt or a sharded one), newest first."""
    if not os.path.isdir(out_dir):
        return []
    found = []
    for name in os.listdir(out_dir):
        m = re.fullmatch(r"earlier-(\d{8}-\d{6})(?:-(\d+))?", name)
        path = os.path.join(out_dir, name)
        if m and any(os.path.exists(os.path.join(path, f)) for f in ("ckpt.pt", "ckpt_dcp")):
            found.append(((m.group(1), int(m.group(2) or 1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def set_aside(out_dir):
    """Move an earlier run's files into out_dir/earlier-<date>-<time>/, saying so. Returns that folder, or
    None when there was nothing to move; on a failure, what was moved goes back."""
    names = earlier_run(out_dir)
    if not names:
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    dest, n = os.path.join(out_dir, f"earlier-{stamp}"), 1
    while os.path.lexists(dest):
        n += 1
        dest = os.path.join(out_dir, f"earlier-{stamp}-{n}")
    try:
        os.makedirs(dest)
        for name in names:
            os.rename(os.path.join(out_dir, name), os.path.join(dest, name))
    except OSError as e:
        if os.path.isdir(dest):
            for name in os.listdir(dest):
                move(dest, out_dir, name)
            os.rmdir(dest)
        raise UserError(f"out_dir {out_dir} holds an earlier run ({', '.join(names)}) that could not be moved "
                        f"aside to {dest} ({e.strerror or e}): choose another --out_dir, or resume it with "
                        f"--init_from=resume")
    print(f"note: {out_dir} held an earlier run; its {', '.join(names)} are kept in {dest} (this is a new run: "
          f"to continue that one instead, use --init_from=resume --out_dir={dest})")
    return dest
