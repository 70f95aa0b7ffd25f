"""
How much of each package's files the kernel holds in its page cache (mincore(2)), without importing them: a
launch that finds a package's shared libraries there maps them from memory, one that does not reads them from
disk. Used to tell a cold launch's disk reads from its compile work (docs/records/2026-11-27-speedrun.md, "Start-up").
$ python dev/page_cache.py torch triton numpy /usr/lib/gcc      # packages by name, or folders and files
$ python dev/page_cache.py --evict triton /usr/lib/gcc          # drop them from it first (a machine's first
                                                                    # launch, without rebooting it)
Prints one line per argument: MB resident of MB in its files, and the largest files' shares. Linux only.
"""
import ctypes
import importlib.util
import mmap
import os
import sys

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident(path):
    """(bytes in the page cache, bytes) of one file; mapping it reads nothing."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0, size
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        ok = libc.mincore(addr, size, vec) == 0
        libc.munmap(addr, size)
        return (sum(b & 1 for b in vec) * PAGE if ok else 0), size
    finally:
        os.close(fd)


def files(arg):
    """The files of a package name (found without importing it), a folder or a file."""
    if not os.path.exists(arg):
        spec = importlib.util.find_spec(arg)
        if spec is None:
            return []
        arg = list(spec.submodule_search_locations or [])[0] if spec.submodule_search_locations else spec.origin
    if os.path.isfile(arg):
        return [arg]
    return [os.path.join(d, f) for d, _, names in os.walk(arg) for f in names
            if os.path.isfile(os.path.join(d, f)) and not os.path.islink(os.path.join(d, f))]


def evict(path):
    """Ask the kernel to drop the file's clean pages from its cache (posix_fadvise DONTNEED; pages a running
    process has mapped stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


args = sys.argv[1:]
dropping = args[:1] == ['--evict']
for arg in args[dropping:]:
    paths = files(arg)
    if dropping:
        for p in paths:
            evict(p)
    sizes = [(p, *resident(p)) for p in paths]
    have, total = sum(s[1] for s in sizes), sum(s[2] for s in sizes)
    big = sorted(sizes, key=lambda s: -s[2])[:3]
    print(f"{arg}: {have / 2**20:.0f} of {total / 2**20:.0f} MB in the page cache; largest: "
          + ", ".join(f"{os.path.basename(p)} {h / 2**20:.0f}/{t / 2**20:.0f}" for p, h, t in big), flush=True)
