"""The run's folder, out_dir: held by one run at a time, never shared by two runs' files, never written through a link
(docs/checkpoints.md#one-run-per-out_dir). check() touches nothing; claim() makes, locks and (a new run) clears it."""
import atexit
import datetime
import errno
import fcntl
import os
import re
import socket
import tempfile
import uuid
from contextlib import suppress

from gpt.runtime.errors import UserError
from gpt.runtime.files import nearest_existing

LOCK_NAME = "run.lock"
# what belongs to a run: its log and checkpoints (also ckpt-<iter>.pt and ckpt-tok....pt: is_run_file)
RUN_FILES = ("log.jsonl", "ckpt.pt", "ckpt_dcp", "ckpt_dcp.old")


def check(out_dir, fresh):
    """Everything claim() needs, checked without touching the disk."""
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
    for path, nofollow in ((out_dir, False), (os.path.join(out_dir, LOCK_NAME), True)):
        with suppress(OSError):  # no run.lock: nobody holds it
            fd = os.open(path, os.O_RDONLY | (os.O_NOFOLLOW if nofollow else 0))
            try:
                lock(fd, out_dir)  # closing fd lets go of it again
            finally:
                os.close(fd)
    if fresh and (stuck := [f for f in earlier_run(out_dir) if os.path.isdir(os.path.join(out_dir, f))
                            and not os.access(os.path.join(out_dir, f), os.W_OK)]):  # moving a folder rewrites its '..'
        raise UserError(f"out_dir {out_dir} holds an earlier run whose {', '.join(stuck)} cannot be moved aside "
                        f"(not writable): choose another --out_dir, or resume it with --init_from=resume")


def check_no_links(out_dir):
    """A UserError naming each symbolic link where the run would write a file of its own."""
    if links := [os.path.join(out_dir, f) for f in sorted(os.listdir(out_dir))
                 if (f in (LOCK_NAME, "ckpt_dcp.tmp") or is_run_file(f)) and os.path.islink(os.path.join(out_dir, f))]:
        named = ", ".join(f"{path} (a link to {os.readlink(path)})" for path in links)
        them = "it (what it points to" if len(links) == 1 else "them (what they point to"
        raise UserError(f"{named}: a run writes its own files in out_dir, never through a link; remove {them} "
                        f"stays as it is), or, to keep the run's files elsewhere, make out_dir itself the link")


def lock(fd, out_dir):
    """flock fd: True, False where its file system cannot lock it, a UserError naming the run that holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserError(f"out_dir {out_dir} is in use by another run ({holder(out_dir)}): wait for it to end, "
                            f"stop it, or choose another --out_dir") from None
        return False


def holder(out_dir):
    """Who holds out_dir, in words: what its run.lock says, else the folder lock's PID (Linux's /proc/locks)."""
    path = os.path.join(out_dir, LOCK_NAME)
    with suppress(OSError), open(path, "rb") as f:
        return f"{f.read(1000).decode(errors='replace').strip() or 'just starting'}; lock {path}"
    pids = set()
    with suppress(OSError), open("/proc/locks") as f:
        ino = os.stat(out_dir).st_ino
        rows = (re.search(r"FLOCK\s+\S+\s+WRITE\s+(\d+)\s+\w+:\w+:(\d+)\s", row) for row in f)
        pids = {m.group(1) for m in rows if m and int(m.group(2)) == ino}
    who = f"PID {pids.pop()}" if len(pids) == 1 else "a process"
    return f"{who} on this host holds the folder's lock; its {LOCK_NAME} was removed"


def claim(out_dir, fresh):
    """Make out_dir ready: made, writable, locked, (fresh) an earlier run's files moved aside; a failure undoes all."""
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
    """Fail now, not at the first save, where access(2) says yes but no file can be made (full disk, quota)."""
    try:
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as e:
        raise UserError(f"out_dir {out_dir} is not writable ({e.strerror or e}): choose another --out_dir")


class Claim:
    """One run's hold on out_dir: the folder's lock and run.lock's, the run id written in run.lock, and what
    claim() changed (folders made, an earlier run moved aside), undone if the run fails before it starts."""

    def __init__(self, out_dir):
        self.out_dir, self.lock_path = out_dir, os.path.join(out_dir, LOCK_NAME)
        self.made, self.aside, self.dir_fd, self.lock_fd = [], None, None, None
        self.folder = None  # out_dir's (device, inode) when claimed: moved or replaced later, it is not ours
        self.lock_text = b""  # what this run wrote into run.lock
        self.settled = False  # the run has started: nothing is undone

    def hold(self):
        """Lock the folder (kept when run.lock is removed by hand), then run.lock (NFS locks only files)."""
        st = os.stat(self.out_dir)
        self.folder = (st.st_dev, st.st_ino)
        self.dir_fd = os.open(self.out_dir, os.O_RDONLY)
        if not lock(self.dir_fd, self.out_dir):
            os.close(self.dir_fd)
            self.dir_fd = None
        while True:  # until the locked file is the one at the path, and ours alone
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError:
                check_no_links(self.out_dir)  # a link made since check(): refused as check() does
                raise
            try:
                locked = lock(fd, self.out_dir)
            except UserError:
                os.close(fd)
                raise
            if not locked:
                os.close(fd)
                print(f"note: cannot lock {self.lock_path}: nothing keeps a second run out of {self.out_dir}")
                return
            with suppress(FileNotFoundError):
                st, mine = os.lstat(self.lock_path), os.fstat(fd)
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):  # not one a run that just ended removed
                    if mine.st_nlink == 1:
                        break
                    os.remove(self.lock_path)  # also another folder's (a `cp -al` copy): this run makes its own
            os.close(fd)
        if previous := os.read(fd, 1000).decode(errors="replace").strip():
            print(f"note: taking over {self.lock_path} from a run that ended without releasing it ({previous})")
        text = (f"PID {os.getpid()} on host {socket.gethostname()}, since "
                f"{datetime.datetime.now().isoformat(timespec='seconds')}, run {uuid.uuid4().hex[:12]}\n").encode()
        with suppress(OSError):  # a full disk: the lock holds all the same, without the holder's name
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)  # no buffer that could fail to flush at exit
            self.lock_text = text
        self.lock_fd = fd

    def owner_problem(self):
        """Why out_dir is no longer this run's, in words, or None (asked before every save)."""
        try:
            st = os.stat(self.out_dir)
        except OSError as e:
            return f"{self.out_dir} is gone ({e.strerror or e})"
        if (st.st_dev, st.st_ino) != self.folder:
            return f"{self.out_dir} is no longer the folder this run claimed ({holder(self.out_dir)})"
        if self.lock_fd is None:
            return None
        try:
            st = os.lstat(self.lock_path)
            with open(self.lock_path, "rb") as f:
                text = f.read(1000)
        except FileNotFoundError:  # removed by hand: harmless while the folder lock holds
            return None if self.dir_fd is not None else (f"{self.lock_path} was removed, so this run cannot tell "
                                                         f"whether another run has used {self.out_dir} since")
        mine = os.fstat(self.lock_fd)
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino) or text != self.lock_text:
            return f"another run has claimed {self.out_dir} ({text.decode(errors='replace').strip() or 'unnamed'})"
        return None

    def settle(self):
        """The run has started (its first step is next): from now on undo() leaves everything as it is."""
        self.settled = True

    def undo(self, quiet=False):
        """Unless the run has started, put the disk back as claim() found it (once)."""
        if self.settled:
            return
        self.settled = True
        if self.aside:
            back = move_all(self.aside, self.out_dir)
            where = f"stay in {self.aside}" if os.path.exists(self.aside) else f"are back in {self.out_dir}"
            if not quiet:
                print(f"note: this run did not start, so the earlier run's {', '.join(back) or 'files'} {where}")
        self.release()
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty (or not ours to remove): it stays, and so do the folders above it

    def release(self):
        """A clean end: remove run.lock (never another run's), then let go of both locks."""
        if self.lock_fd is not None:
            if self.owner_problem() is None:
                with suppress(OSError):
                    os.remove(self.lock_path)
            os.close(self.lock_fd)  # a run that opened the file meanwhile sees it gone from its path, and retries
            self.lock_fd = None
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None


def move_all(src, dst):
    """Move src's files into dst, each whose name dst does not have, then remove src if empty; the names moved."""
    moved = []
    for name in sorted(os.listdir(src)):
        if not os.path.lexists(os.path.join(dst, name)):
            with suppress(OSError):
                os.rename(os.path.join(src, name), os.path.join(dst, name))
                moved.append(name)
    with suppress(OSError):
        os.rmdir(src)
    return moved


def is_run_file(name):
    return name in RUN_FILES or (name.startswith("ckpt-") and name.endswith(".pt"))


def earlier_run(out_dir):
    return sorted(f for f in os.listdir(out_dir) if is_run_file(f))


def earlier_runs(out_dir):
    """The earlier-* folders in out_dir that hold a checkpoint (ckpt.pt or a sharded one), newest first."""
    found = []
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        m = re.fullmatch(r"earlier-(\d{8}-\d{6})(?:-(\d+))?", name)
        path = os.path.join(out_dir, name)
        if m and any(os.path.exists(os.path.join(path, f)) for f in ("ckpt.pt", "ckpt_dcp")):
            found.append(((m.group(1), int(m.group(2) or 1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def set_aside(out_dir):
    """Move an earlier run's files into out_dir/earlier-<date>-<time>/ (back, if that fails); that folder, or None."""
    if not (names := earlier_run(out_dir)):
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
            move_all(dest, out_dir)
        raise UserError(f"out_dir {out_dir} holds an earlier run ({', '.join(names)}) that could not be moved aside to "
                        f"{dest} ({e.strerror or e}): choose another --out_dir, or resume it with --init_from=resume")
    print(f"note: {out_dir} held an earlier run; its {', '.join(names)} are kept in {dest} (this is a new run: "
          f"to continue that one instead, use --init_from=resume --out_dir={dest})")
    return dest
