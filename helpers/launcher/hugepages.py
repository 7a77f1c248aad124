"""Back the process's anonymous memory with 2 MiB pages, so that forking it is cheap. Importing it does that.

A forkserver with torch and torch._dynamo imported holds ~190 MiB of private memory in 4 KiB pages: each fork
copies their ~48,000 page-table entries, and each rank's exit frees them again (measured on the 2-core machine:
15 ms in the forkserver and 20 ms more in the rank, per rank). The same memory in 2 MiB pages (Linux's
MADV_COLLAPSE, 6.1 and later) is ~95 entries: 2.4 ms and 6 ms. The collapse costs ~0.4 s of CPU once, repaid after
about 16 ranks; make test forks ~2,000.

The forkserver imports the modules of its preload before it forks anything, and nothing else, so the launcher lists
this module last in the preload (helpers.launch.preload_modules) and its import is the collapse. Where there is no
MADV_COLLAPSE (an older kernel, transparent huge pages set to "never", macOS) the import does nothing.
DP_COURSE_HUGEPAGES=0 turns it off.
"""
import ctypes
import os

MADV_COLLAPSE = 25  # <linux/mman.h>
HUGE_PAGE = 2 << 20


def _private_anonymous(maps_lines):
    """(start, end) of each private writable anonymous mapping (the heap included), rounded in to huge pages."""
    for line in maps_lines:
        fields = line.split()
        perms, path = fields[1], (fields[5] if len(fields) > 5 else "")
        if not perms.startswith("rw") or perms[3] != "p" or path not in ("", "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start, end = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
        if end > start:
            yield start, end


def collapse():
    """Collapse this process's private anonymous memory into huge pages; how many MiB (0 where unsupported)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except (OSError, AttributeError, TypeError):  # no /proc (macOS), no libc by that name (Windows)
        return 0
    done = 0
    for start, end in _private_anonymous(lines):
        # A range the kernel cannot collapse (EINVAL, ENOMEM) is left as it is: it forks as it did before.
        if libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done >> 20


if os.environ.get("DP_COURSE_HUGEPAGES", "1") != "0":
    collapse()
