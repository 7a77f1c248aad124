"""A pids cgroup per graded kernel: a fork bomb meets `pids.max` instead of filling the machine.

RLIMIT_NPROC (`prlimit --nproc`) counts every process of the user on the whole machine, is not enforced for
root, and was not enforced at all on the gVisor machine this course is built on (a bomb under
`prlimit --nproc=291` ran for 60 s). A cgroup's `pids.max` counts only the kernel's own tasks (threads
included), and its member list lets the grader kill every one of them. Needs write access to the pids
hierarchy: cgroup v1 (`/sys/fs/cgroup/pids`) or v2 with the pids controller enabled, i.e. root or a
delegated subtree.
"""
import os
import signal
import time

_V1 = "/sys/fs/cgroup/pids"
_V2 = "/sys/fs/cgroup"
PREFIX = "dp-grade-"  # a kernel's cgroup is PREFIX + "<pid of its grading process>-<serial>"


def pids_root():
    """The directory new pids cgroups go in, or None where we cannot make one."""
    if os.path.isfile(os.path.join(_V1, "cgroup.procs")):
        root = _V1
    else:
        try:
            with open(os.path.join(_V2, "cgroup.subtree_control")) as f:
                root = _V2 if "pids" in f.read().split() else None
        except OSError:
            root = None
    return root if root and os.access(root, os.W_OK) else None


class PidsCgroup:
    """One kernel's cgroup: `enter_argv()` puts a command in it; `kill()` and `remove()` end it."""

    def __init__(self, name, max_tasks=None):
        """Make (or, with max_tasks None, take over) the cgroup `name`."""
        self.path = os.path.join(pids_root(), name)
        os.makedirs(self.path, exist_ok=True)
        if max_tasks is not None:
            with open(os.path.join(self.path, "pids.max"), "w") as f:
                f.write(str(int(max_tasks)))

    def enter_argv(self):
        """A prefix that moves the process into the cgroup, then execs the rest of the command."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh"]

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


def remove_left_by(pid):
    """Kill and remove the cgroups of grading process `pid`, killed (overdue, interrupted) before it could."""
    root = pids_root()
    for name in sorted(os.listdir(root)) if root else []:
        if name.startswith(f"{PREFIX}{pid}-"):
            PidsCgroup(name).remove()
