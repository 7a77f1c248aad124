"""A pids cgroup per graded kernel: a fork bomb meets `pids.max` instead of filling the machine; memory cgroups for
the kernel and for the grading process of each student: a submission that fills either meets a limit of its own.

RLIMIT_NPROC (`prlimit --nproc`) counts every process of the user on the whole machine, is not enforced for
root, and was not enforced at all on the gVisor machine this course is built on (a bomb under
`prlimit --nproc=291` ran for 60 s). A cgroup's `pids.max` counts only the kernel's own tasks (threads
included), and its member list lets the grader kill every one of them. Needs write access to the pids
hierarchy: cgroup v1 (`/sys/fs/cgroup/pids`) or v2 with the pids controller enabled, i.e. root or a
delegated subtree.

Memory (issue 29: an answer's 435 MiB display grew its student's grading process to 2 GiB, with no limit): a memory
cgroup (v1 `memory.limit_in_bytes`, v2 `memory.max`) holds the kernel with its ranks (the name of its pids cgroup),
and another the student's grading process (PREFIX + "<pid>-grader"). Past its limit the kernel meets the
out-of-memory killer of its own cgroup, not the machine's: the cell is an error that says so (execute._Watch); the
grading process is killed and the student's status is "memory_limit" (grade._check_result). Where no memory cgroup can
be made, prlimit's address-space cap fences the kernel, and RLIMIT_AS the grading process (MemoryError).
"""
import os
import resource
import signal
import time

_V1 = "/sys/fs/cgroup/pids"
_V1_MEMORY = "/sys/fs/cgroup/memory"
_V2 = "/sys/fs/cgroup"
PREFIX = "dp-grade-"  # a kernel's cgroup is PREFIX + "<pid of its grading process>-<serial>"


def _root(v1, controller):
    if os.path.isfile(os.path.join(v1, "cgroup.procs")):
        root = v1
    else:
        try:
            with open(os.path.join(_V2, "cgroup.subtree_control")) as f:
                root = _V2 if controller in f.read().split() else None
        except OSError:
            root = None
    return root if root and os.access(root, os.W_OK) else None


def pids_root():
    """The directory new pids cgroups go in, or None where we cannot make one."""
    return _root(_V1, "pids")


def memory_root():
    """The directory new memory cgroups go in, or None where we cannot make one."""
    return _root(_V1_MEMORY, "memory")


class PidsCgroup:
    """One kernel's cgroup: `enter_argv()` puts a command in it; `kill()` and `remove()` end it."""

    def __init__(self, name, max_tasks=None):
        """Make (or, with max_tasks None, take over) the cgroup `name`."""
        self.path = os.path.join(pids_root(), name)
        os.makedirs(self.path, exist_ok=True)
        if max_tasks is not None:
            with open(os.path.join(self.path, "pids.max"), "w") as f:
                f.write(str(int(max_tasks)))

    def enter_argv(self, *others):
        """A prefix that moves the process into the cgroup (and the cgroups `others`), then execs the rest of the
        command."""
        moves = "".join(f"echo $$ > {group.path}/cgroup.procs && " for group in (self, *others))
        return ["sh", "-c", f'{moves}exec "$@"', "sh"]

    def limit_hits(self):
        """How often a fork or thread start was refused at pids.max."""
        try:
            with open(os.path.join(self.path, "pids.events")) as f:
                return int(dict(line.split() for line in f if line.strip()).get("max", 0))
        except (OSError, ValueError):
            return 0

    def members(self):
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def kill(self, wait_seconds=5.0):
        """SIGKILL every member until none is left (a fork bomb keeps forking while we kill)."""
        deadline = time.monotonic() + wait_seconds
        while (pids := self.members()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self):
        self.kill()
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # still busy: the next kill() of a later grading, or a reboot, clears it


class MemoryCgroup(PidsCgroup):
    """One memory cgroup: its limit, what it holds, and how often its out-of-memory killer struck."""

    def __init__(self, name, max_bytes=None):
        """Make (or, with max_bytes None, take over) the memory cgroup `name`."""
        root = memory_root()
        self.path, self.v1 = os.path.join(root, name), root != _V2
        os.makedirs(self.path, exist_ok=True)
        if max_bytes is not None:
            with open(os.path.join(self.path, "memory.limit_in_bytes" if self.v1 else "memory.max"), "w") as f:
                f.write(str(int(max_bytes)))

    def enter(self, pid):
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def limit_hits(self):
        """How many processes its out-of-memory killer killed."""
        try:
            with open(os.path.join(self.path, "memory.oom_control" if self.v1 else "memory.events")) as f:
                return int(dict(line.split() for line in f if line.strip()).get("oom_kill", 0))
        except (OSError, ValueError):
            return 0


def grader_cgroup_name(pid):
    """The memory cgroup of the grading process `pid` (grade_student)."""
    return f"{PREFIX}{pid}-grader"


def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def limit_this_process(grow_bytes, use_cgroup):
    """Let this grading process grow by at most grow_bytes from now: in a memory cgroup of its own where one can be
    made (its out-of-memory killer kills it, and its parent reads that: grader_memory_hits), else by RLIMIT_AS
    (a MemoryError here). Its kernels leave the cgroup for their own as they start (sandbox.make_kernel_manager); a
    kernel inherits the RLIMIT_AS, as the soft limit only, which prlimit --as then sets for it."""
    if not grow_bytes:
        return
    if use_cgroup and memory_root():  # a cgroup counts only what is charged after a process enters it: the growth
        MemoryCgroup(grader_cgroup_name(os.getpid()), grow_bytes).enter(os.getpid())
    else:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (_status_kib("VmSize") * 1024 + grow_bytes, hard))


def grader_memory_hits(pid):
    """How often the memory cgroup of grading process `pid` killed (0 without one)."""
    root = memory_root()
    if not root or not os.path.isdir(os.path.join(root, grader_cgroup_name(pid))):
        return 0
    return MemoryCgroup(grader_cgroup_name(pid)).limit_hits()


def remove_left_by(pid):
    """Kill and remove the cgroups of grading process `pid`, killed (overdue, interrupted) before it could."""
    for root, kind in ((pids_root(), PidsCgroup), (memory_root(), MemoryCgroup)):
        for name in sorted(os.listdir(root)) if root else []:
            if name.startswith(f"{PREFIX}{pid}-") and os.path.isdir(os.path.join(root, name)):
                kind(name).remove()
