"""Back a process's anonymous memory with 2 MiB pages, so that forking it is cheap (once it forks a lot).

A forkserver with torch and torch._dynamo imported holds ~190 MiB of private memory in 4 KiB pages: each fork
copies their ~48,000 page-table entries, and each rank's exit frees them again (measured on the 2-core machine:
15 ms in the forkserver and 20 ms more in the rank, per rank). The same memory in 2 MiB pages (Linux's
MADV_COLLAPSE, 6.1 and later) is ~95 entries: 2.4 ms and 6 ms. The collapse costs ~0.4 s of CPU once, repaid after
about 16 forks; make test forks ~2,000 ranks.

The launcher lists this module last in the forkserver's preload (forkserver.preload_modules). Importing it
registers a fork handler: the importing process collapses its memory just before its COLLAPSE_AT_FORK-th fork
(helpers.launcher.forkserver moves the count to the forkserver it forks, count_forks_here), so a kernel
that launches a few ranks (a graded one, most of make test's 40) never pays the 0.4 s, and one that launches many
pays it once. A forkserver that is itself a fork of its kernel (helpers.launcher.kernel) then holds its own copy of
what it shared with the kernel (~190 MiB). A process that forks a lot from the start (tests/kernel_zygote.py) calls
collapse() itself. Where there is no MADV_COLLAPSE (an older kernel, transparent huge pages set to "never",
macOS) nothing is collapsed. DP_COURSE_HUGEPAGES=0 turns it off.
"""
import ctypes
import os

MADV_COLLAPSE = 25  # <linux/mman.h>
HUGE_PAGE = 2 << 20
ENABLED = os.environ.get("DP_COURSE_HUGEPAGES", "1") != "0"
# The collapse (0.4 s) is repaid by ~16 forks (25 ms each): collapsing at the 16th fork, the ski-rental rule, costs at
# most twice what knowing the number of forks in advance would (a process that forks fewer than 16 never pays).
COLLAPSE_AT_FORK = 16
_owner, _forks = os.getpid(), 0  # the process whose forks are counted (the importer: a forkserver), and how many


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
    if not ENABLED:
        return 0
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


def count_forks_here():
    """Count this process's forks from now on, and only its own: a forkserver forked from its kernel calls it.

    Only the owner counts: a child forking on its own (a student's fork bomb, 64 copies of a kernel) never collapses,
    which would cost 0.4 s in every copy."""
    global _owner, _forks
    _owner, _forks = os.getpid(), 0


def _before_fork():
    global _forks
    if os.getpid() != _owner:
        return
    _forks += 1
    if _forks == COLLAPSE_AT_FORK:
        collapse()


if ENABLED:
    os.register_at_fork(before=_before_fork)
