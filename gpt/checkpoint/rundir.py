"""
The run's folder, out_dir: writable, held by one run at a time, and never shared by two runs' files.

- check(out_dir, fresh) says everything that can go wrong, touching nothing: out_dir is a folder that can be
  written or made (a failed check leaves no empty folder behind), no live run holds it, and (fresh) an
  earlier run's files in it can be moved aside. The run plan calls it before any side effect.
- claim(out_dir, fresh) then does it: makes out_dir, locks it, and (fresh: a new run, not a resumed one)
  moves an earlier run's files aside. It returns a Claim: what this run holds and changed, so that
  `Claim.owner_problem` can tell before every save that the folder is still this run's, and `Claim.undo` can
  put the disk back as it was when a run fails before it starts (errors.on_failure calls it).
- Two locks are held for the life of the run (rank 0 alone under torchrun), both flock(2), which the kernel
  drops when its process dies, however it dies: one on out_dir/run.lock, which holds the holder's PID, host
  and a run id, and one on the folder itself. Removing run.lock by hand cannot remove the second, so a
  second run is refused all the same (naming the holder's PID from /proc/locks where there is one). flock
  on a folder works on Linux and macOS (BSD flock takes any open file, folders included). run.lock is
  removed at a clean exit, so a run that finds it there, unlocked, says it takes over from one that died.
  On NFS, Linux turns flock into an NFS byte-range lock that other clients see (NFSv4, or v3 with lockd);
  those are locks on files, so the folder lock may not be had there: then run.lock alone keeps runs apart,
  and a run.lock removed by hand stops the next save (`owner_problem`) rather than let two runs mix. A mount
  with `nolock` or `local_lock=all` keeps locks on one machine, and then only runs on the same node are kept
  apart.
- A new run into a folder holding an earlier run's log or checkpoints moves them into
  out_dir/earlier-<date>-<time>/ first, saying so: nothing of the earlier run is mixed in or deleted, and it
  can still be resumed from there.
- The run's own files are never written through a link. A symbolic link where a run keeps a file of its own
  (run.lock, log.jsonl, ckpt.pt, ckpt-*.pt, ckpt_dcp/) is refused by check(), naming it, since writing
  there would change the file it points to (a run.lock linked to ~/.bashrc would be truncated); run.lock is
  opened with O_NOFOLLOW in case one appears after the check. out_dir itself may be a link (out ->
  /scratch/run): that is where the user put the folder. A hard-linked run.lock (the folder copied with
  `cp -al`) is replaced by a file of this run's own, so the copy's is left as it was; the log does the same
  (gpt/monitor/trainlog.py), and checkpoints are written to new files and renamed (gpt/runtime/files.py), which never
  touches another name's file.
"""
import atexit
import datetime
import errno
import os
import re
import socket
import tempfile
import uuid

from gpt.runtime.errors import UserError
from gpt.runtime.files import nearest_existing

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

LOCK_NAME = "run.lock"
# what belongs to a run: its log and checkpoints (ckpt-<iter>.pt, ckpt-tok....pt, fsdp's ckpt_dcp/)
RUN_FILES = ("log.jsonl", "ckpt.pt", "ckpt_dcp", "ckpt_dcp.old")
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # Windows has none (nor links a user makes without privileges)
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


def own_files(out_dir):
    """The names in out_dir of files a run writes itself (its lock, log and checkpoints, a sharded save's
    temporary folder)."""
    return [f for f in os.listdir(out_dir) if f in (LOCK_NAME, "ckpt_dcp.tmp") or is_run_file(f)]


def check_no_links(out_dir):
    """A UserError naming each symbolic link where the run would write a file of its own."""
    links = [os.path.join(out_dir, f) for f in sorted(own_files(out_dir)) if os.path.islink(os.path.join(out_dir, f))]
    if links:
        named = ", ".join(f"{path} (a link to {os.readlink(path)})" for path in links)
        them = "it (what it points to" if len(links) == 1 else "them (what they point to"
        raise UserError(f"{named}: a run writes its own files in out_dir, never through a link; remove {them} "
                        f"stays as it is), or, to keep the run's files elsewhere, make out_dir itself the link")


def in_use(out_dir, holder):
    return UserError(f"out_dir {out_dir} is in use by another run ({holder}): wait for it to end, stop it, or "
                     f"choose another --out_dir")


def claim(out_dir, fresh):
    """Make out_dir ready for a run, before any other use of it: made if need be, writable, locked, and (fresh:
    a new run, not a resumed one) cleared of an earlier run's files, which are kept aside. Returns the Claim;
    a failure here undoes what it did and is one line."""
    check(out_dir, fresh)
    held = Claim(out_dir)
    try:
        held.made = make_folders(out_dir)
        check_writable(out_dir)
        held.hold()
        if fresh:
            held.aside = set_aside(out_dir)
    except BaseException:
        held.undo(quiet=True)
        raise
    atexit.register(held.release)
    return held


def make_folders(out_dir):
    """os.makedirs, returning the folders it made, outermost first (what Claim.undo removes again)."""
    made, path = [], os.path.abspath(out_dir)
    while not os.path.lexists(path):
        made.insert(0, path)
        path = os.path.dirname(path)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"out_dir {out_dir} cannot be made ({e.strerror or e}): choose another --out_dir")
    return made


def check_writable(out_dir):
    """Fail before training, not at the first save, when checkpoints cannot be written (access(2) in check()
    does not see everything: a full disk, a quota, ACLs)."""
    try:
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise UserError(f"out_dir {out_dir} is not writable ({e.strerror or e}): choose another --out_dir")


class Claim:
    """One run's hold on out_dir: its locks, the run id written into run.lock, and what claim() changed
    (the folders it made, the earlier run's files it moved aside), to be undone if the run fails before it
    starts. Held by train.py's rank 0; a resumed or fresh run alike."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.lock_path = os.path.join(out_dir, LOCK_NAME)
        self.run_id = uuid.uuid4().hex[:12]
        self.made = []  # folders claim() made, outermost first
        self.aside = None  # the earlier-* folder the earlier run's files went to, or None
        self.dir_fd = self.lock_fd = None  # the locked folder and lock file (None: no lock to be had)
        self.folder = None  # out_dir's (device, inode) when claimed: moved or replaced later, it is not ours
        self.lock_text = b""  # what this run wrote into run.lock
        self.settled = False  # the run has started: its files are real, nothing is undone

    def hold(self):
        """Take both locks, the folder's first (it survives run.lock being removed); one line if another live
        run holds either."""
        st = os.stat(self.out_dir)
        self.folder = (st.st_dev, st.st_ino)
        if fcntl is None:
            return
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
        while True:  # plain file descriptors: nothing buffered that a full disk could fail to flush at exit
            fd = self.open_lock_file()
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
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
            self.lock_text = text
        except OSError:
            pass  # a full disk: the lock holds all the same, without the holder's name
        self.lock_fd = fd

    def open_lock_file(self):
        """run.lock, made if need be, never through a link: check() refused one, and one made since is too."""
        try:
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644)
        except OSError:
            if os.path.islink(self.lock_path):
                check_no_links(self.out_dir)
            raise

    def owner_problem(self):
        """Why out_dir is no longer this run's, in words, or None: it still is. A query, asked before every
        save: out_dir must be the folder this run claimed (not moved, not removed and made again), and
        run.lock the file this run locked, holding what it wrote (the run id: a new file can reuse the
        inode). A run.lock removed by hand is no problem while the folder lock holds (no other run can have
        claimed the folder); without one it cannot be told from another run that came and went."""
        if self.folder is None:
            return None  # claimed without locks (Windows)
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
        """Put the disk back as claim() found it, unless the run has started (settle): the earlier run's files
        back in out_dir (each whose name this run has not used meanwhile), the locks let go, the folders
        claim() made removed while empty. For a failure before the first step (errors.on_failure); a second
        call does nothing."""
        if self.settled:
            return
        self.settled = True
        if self.aside:
            self.put_back(quiet)
        self.release()
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty (or not ours to remove): it stays, and so do the folders above it

    def put_back(self, quiet):
        back, kept = [], []
        for name in sorted(os.listdir(self.aside)):
            target = os.path.join(self.out_dir, name)
            try:
                if os.path.lexists(target):
                    raise FileExistsError(errno.EEXIST, "exists")
                os.rename(os.path.join(self.aside, name), target)
                back.append(name)
            except OSError:
                kept.append(name)
        if not kept:
            try:
                os.rmdir(self.aside)
            except OSError:
                kept.append("(the folder)")
        if not quiet:
            print(f"note: this run did not start, so the earlier run's {', '.join(back) or 'files'} "
                  + (f"are back in {self.out_dir}" if not kept else f"stay in {self.aside}"))

    def release(self):
        """A clean end: remove the lock file, then let go of the locks (a run that opened the file meanwhile
        sees that it is no longer at its path, and tries again)."""
        if self.lock_fd is not None:
            if self.owner_problem() is None:  # never remove another run's lock file
                try:
                    os.remove(self.lock_path)
                except OSError:
                    pass
            os.close(self.lock_fd)  # closing drops the flock
            self.lock_fd = None
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None


def read_start(path):
    with open(path, "rb") as f:
        return f.read(1000)


def live_holder(out_dir):
    """Who holds out_dir (words), or None: nobody alive. A probe that creates nothing: each lock (the folder's,
    run.lock's if there is one) is tried and at once let go."""
    if fcntl is None:
        return None
    lock = os.path.join(out_dir, LOCK_NAME)
    for path in (out_dir, lock):
        try:
            fd = os.open(path, os.O_RDONLY | (NOFOLLOW if path == lock else 0))
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
    """The live holder of out_dir, in words: what its run.lock says, else its PID from /proc/locks."""
    lock = os.path.join(out_dir, LOCK_NAME)
    try:
        text = read_start(lock).decode(errors="replace").strip()
    except OSError:
        text = ""
    if text:
        return f"{text}; lock {lock}"
    pid = folder_lock_pid(out_dir)
    return (f"{'PID ' + pid if pid else 'a process'} on this host holds the folder's lock; its {LOCK_NAME} was "
            f"removed")


def folder_lock_pid(path):
    """The PID holding an flock on `path`, from Linux's /proc/locks (None where there is none to read)."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            rows = f.read().splitlines()
    except OSError:
        return None
    pids = {m.group(1) for row in rows if (m := re.search(r"FLOCK\s+\S+\s+WRITE\s+(\d+)\s+\w+:\w+:(\d+)\s", row))
            and int(m.group(2)) == ino}
    return pids.pop() if len(pids) == 1 else None


def earlier_run(out_dir):
    """The names of an earlier run's files in out_dir."""
    return sorted(f for f in os.listdir(out_dir) if is_run_file(f))


def is_run_file(name):
    return name in RUN_FILES or (name.startswith("ckpt-") and name.endswith(".pt"))


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
    None when there was nothing to move."""
    names = earlier_run(out_dir)
    if not names:
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    dest, n = os.path.join(out_dir, f"earlier-{stamp}"), 1
    while os.path.lexists(dest):
        n += 1
        dest = os.path.join(out_dir, f"earlier-{stamp}-{n}")
    moved = []
    try:
        os.makedirs(dest)
        for name in names:
            os.rename(os.path.join(out_dir, name), os.path.join(dest, name))
            moved.append(name)
    except OSError as e:
        for name in moved:  # what was moved goes back: a failed run leaves the folder as it found it
            os.rename(os.path.join(dest, name), os.path.join(out_dir, name))
        if os.path.isdir(dest):
            os.rmdir(dest)
        raise UserError(f"out_dir {out_dir} holds an earlier run ({', '.join(names)}) that could not be moved "
                        f"aside to {dest} ({e.strerror or e}): choose another --out_dir, or resume it with "
                        f"--init_from=resume")
    print(f"note: {out_dir} held an earlier run; its {', '.join(names)} are kept in {dest} (this is a new run: "
          f"to continue that one instead, use --init_from=resume --out_dir={dest})")
    return dest
