"""A kernel per submission, inside a bubblewrap sandbox (bwrap, the tool Flatpak uses).

What each fence does, and what it does not (GRADING.md's threat model table is measured by
tests/grading/test_sandbox.py and by the hostile students of tests/grading/hostile.py, graded in
tests/grading/test_grade_fixture.py):
- bwrap `--unshare-pid`: the kernel and everything it starts live in their own PID namespace; they
  cannot see or signal the grader, and all of them die with the sandbox (`--die-with-parent`), daemons
  included;
- bwrap `--unshare-net`: a network namespace with only loopback (the ranks' TCPStore works, nothing else);
- bwrap mounts: the kernel sees only the system (/usr, /etc), the Python installation and the course
  repository, all read-only, plus its own working directory. The solutions, the probes, the tests, the
  repository's .git, the other submissions and the grader's output are empty directories, and so are
  artifacts/ and every earlier grading run's OUT inside the repository (grading_runs: its state.json or the
  grader's executed/, results/, feedback/ layout), whose executed notebooks hold a class's answers and whose
  state.json holds the run's seed and expected values; /tmp, /proc and /dev are private; nothing else of the
  machine (HOME, pip caches, other users' files) exists;
- where it writes: /tmp, /dev/shm, its working directory and TMPDIR are tmpfs of TMPFS_BYTES each (the last two
  sit in the grader's per-student directory, which the kernel sees read-only); the one directory of the grader's
  disk it can write is its sockets' (execute._Watch kills a kernel that piles files up there);
- `prlimit --fsize`: no file it writes grows past FILE_BYTES, its log on the grader's disk included;
- `--cap-drop ALL` when the grader is root: the kernel cannot undo those mounts;
- `prlimit --as`: a memory bomb becomes MemoryError in that kernel, not an out-of-memory kill;
- a memory cgroup per kernel (cgroup.py): the kernel and its ranks together, past `Limits.kernel_memory_bytes`, meet
  their own out-of-memory killer, and the grader kills the kernel (each process alone is only under `--as`);
- the probes' pipe (channel.py): its write end is the one descriptor besides stdio the kernel inherits (`pass_fds`);
- `setpriv` to nobody (root only, when nobody can run the interpreter: one under /root cannot be);
- the grader kills the sandbox when a cell overruns its limit (execute.py).
Not stopped: CPU use within the time limits, reading the public parts
of the repository, and kernel exploits. Where bwrap cannot run (not installed; user namespaces disabled
for non-root users), the grader says which fences are missing and runs without them.
"""
import dataclasses
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from helpers.grading.run.cgroup import PREFIX, MemoryCgroup, PidsCgroup, memory_root, pids_root
from helpers.grading.run.channel import FD_VARIABLE

NOBODY_UID = NOBODY_GID = 65534
# System directories a Python needs; on merged-/usr systems /bin, /lib... are symlinks into /usr.
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Readable by root only, and of no use to a kernel.
_SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
TMPFS_BYTES = 256 * 2**20  # each tmpfs of the sandbox: /tmp, /dev/shm, the working directory and TMPDIR
# Every file a kernel writes (prlimit --fsize): its log on the grader's disk, a checkpoint. Python ignores SIGXFSZ,
# so a write past it fails with "File too large" instead of killing the kernel.
FILE_BYTES = 2**30
# The one directory on the grader's disk a sandboxed kernel can write: its sockets' (the grader connects there).
# A kernel keeps about 7 entries in it and no data; the grader kills one that piles up more (execute._Watch).
RUNTIME_ENTRIES, RUNTIME_BYTES = 64, 2**20


@dataclasses.dataclass(frozen=True)
class Fences:
    """Which fences this machine can put around a graded kernel."""

    sandbox: bool  # bwrap runs: PID, network, mount, IPC and UTS namespaces
    drop_user: bool  # the kernel runs as nobody
    memory: bool  # prlimit caps the address space and the size of each file
    pids: bool = False  # a pids cgroup caps the kernel's tasks (fork bombs)
    memory_cgroups: bool = False  # memory cgroups cap the kernel with its ranks, and the grading process

    def missing(self):
        """One-line names of the fences that are not there, with what to do."""
        gaps = []
        if not self.sandbox:
            gaps.append("no sandbox (install bubblewrap: `apt-get install bubblewrap`; as a non-root user it also "
                        "needs unprivileged user namespaces): kernels can signal the grader, use the network and "
                        "read the solutions, the probes and other submissions")
        if not self.memory:
            gaps.append("no memory or file-size limit (prlimit from util-linux is missing)")
        if not self.pids:
            gaps.append("no task limit (no writable pids cgroup: grade as root): a fork bomb slows the machine "
                        "until the cell's time limit kills it")
        if not self.memory_cgroups:
            gaps.append("no memory cgroup (grade as root): each process of a kernel has its own address-space cap, "
                        "not the kernel with its ranks together, and the grading process only RLIMIT_AS")
        return gaps


def _runs(argv):
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _setpriv_argv():
    return ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", "--"]


@functools.cache
def available_fences():
    """Fences that work here, each tried once for real."""
    bwrap_ok = shutil.which("bwrap") is not None and _runs(
        ["bwrap", *_namespace_flags(), *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--", "true"])
    return Fences(sandbox=bwrap_ok, drop_user=bwrap_ok and _can_drop_user(), memory=shutil.which("prlimit") is not None,
                  pids=pids_root() is not None, memory_cgroups=memory_root() is not None)


def _can_drop_user():
    """Root, setpriv, and nobody can run this interpreter and bwrap (a Python under /root cannot be)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run([*_setpriv_argv(), "bwrap", *_namespace_flags(as_root=False), "--ro-bind", "/", "/",
                            "--", sys.executable, "-c", "import os; print(os.__file__)"],
                           capture_output=True, text=True)
    # A Python under /root starts as nobody but silently picks up another standard library.
    return probe.returncode == 0 and probe.stdout.strip() == os.__file__


def _namespace_flags(as_root=None):
    as_root = os.geteuid() == 0 if as_root is None else as_root
    flags = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
             "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grading"]
    # Root keeps every capability inside bwrap unless told otherwise, and could unmount the hiding tmpfs.
    return flags + (["--cap-drop", "ALL"] if as_root else [])


def _system_binds():
    argv = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def _under(path, roots):
    return any(os.path.commonpath([path, root]) == root for root in roots)


# What helpers/grading/state.py and grade.py write in an OUT: a run is recognised by either.
_RUN_STATE = "state.json"
_RUN_LAYOUT = ("executed", "results", "feedback")
_STATE_BYTES = 64 * 2**20  # a state.json holds expected values: megabytes at most


def _is_run(directory, names, subdirs):
    if all(sub in subdirs for sub in _RUN_LAYOUT):
        return True
    if _RUN_STATE not in names:
        return False
    path = os.path.join(directory, _RUN_STATE)
    try:
        if os.path.getsize(path) > _STATE_BYTES:
            return False
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and {"lab", "seed", "fingerprint"} <= state.keys()


def grading_runs(root, skip=()):
    """Directories under root (not root itself) that hold a grader's run: an earlier OUT left in the repository.

    skip: directories not searched (the Python installation: its thousands of files hold no run). .git is not
    searched either."""
    root, runs = os.path.abspath(root), []
    skip = {os.path.abspath(d) for d in skip} | {os.path.join(root, ".git")}
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if os.path.join(directory, d) not in skip
                      and not os.path.islink(os.path.join(directory, d))]
        if directory != root and _is_run(directory, names, subdirs):
            runs.append(directory)
            subdirs[:] = []  # hidden whole
    return runs


def bwrap_argv(workdir, readonly_dirs, hidden_dirs, tmpfs_bytes=TMPFS_BYTES):
    """bwrap's arguments: system and readonly_dirs read-only, hidden_dirs empty; what the kernel may write is a tmpfs
    of tmpfs_bytes each (its working directory, TMPDIR, /tmp, /dev/shm) but the directory of its sockets."""
    readonly = [d for d in dict.fromkeys(readonly_dirs) if os.path.isdir(d)]
    # Private /proc, /dev and /tmp first: a later mount covers an earlier one, and the repository or the
    # working directory may well live under /tmp (a fresh clone in `mktemp -d`).
    # A tmpfs is memory that no process's `prlimit --as` counts: 1 GiB written to an unbounded /tmp stayed in the
    # machine's RAM. Both are capped (/dev/shm would otherwise be a directory of /dev's unbounded tmpfs).
    size = ["--size", str(tmpfs_bytes)]
    argv = ["bwrap", *_namespace_flags(), *_system_binds(), "--proc", "/proc", "--dev", "/dev",
            *size, "--tmpfs", "/dev/shm", *size, "--tmpfs", "/tmp"]
    for path in readonly:
        argv += ["--ro-bind", path, path]
    # Later mounts cover earlier ones: hide what lies inside a read-only directory, then give the kernel its own.
    for path in hidden_dirs:
        if os.path.isdir(path) and _under(path, readonly) and not _under(workdir, [path]):
            argv += ["--tmpfs", path, "--remount-ro", path]  # empty, and nothing can be left there either
    for path in _SECRET_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    argv += ["--ro-bind", hosts_file(workdir), "/etc/hosts"]
    # The working directory lives on the grader's disk, beside the results: the kernel sees it read-only, and a
    # capped tmpfs where it writes. Only the sockets' directory is the grader's own (it connects there).
    runtime = runtime_dir(workdir)
    argv += ["--ro-bind", workdir, workdir, "--bind", runtime, runtime]
    for path in (working_directory(workdir), os.path.join(workdir, "kernel", "tmp")):
        argv += [*size, "--tmpfs", path]
    # ipykernel exits when its parent seems gone (parent pid 1), as bwrap's init is inside a PID namespace;
    # the sandbox dies with the grader anyway.
    argv += ["--remount-ro", "/", "--chdir", working_directory(workdir)]
    return argv + ["--unsetenv", "JPY_PARENT_PID"]


def kernel_argv(workdir, limits):
    """The command that starts an ipykernel inside the fences."""
    argv = []
    caps = [f"--as={int(limits.memory_bytes)}"] if limits.memory_bytes else []
    caps += [f"--fsize={int(limits.file_bytes)}"] if limits.file_bytes else []
    if caps and limits.fences.memory:  # the memory fence is prlimit
        argv += ["prlimit", *caps, "--"]
    if limits.fences.drop_user:
        argv += _setpriv_argv()
    if limits.fences.sandbox:
        argv += bwrap_argv(workdir, limits.readonly_dirs, limits.hidden_dirs)
    # helpers.launcher.kernel: ipykernel_launcher with the launcher's forkserver forked at start
    # (no second torch import). No history file: IPython writes every cell it runs into a SQLite file in IPYTHONDIR
    # as it starts it, so an answer a probe calls could read the probe cell (its SETUP, the solution's earlier
    # answers) with sqlite3, a name no scan refuses.
    return argv + [sys.executable, "-m", "helpers.launcher.kernel", "--HistoryManager.enabled=False",
                   "-f", "{connection_file}"]


# The student's code works in work/ (its cwd and HOME); the kernel's own files live beside it, so
# that emptying the working directory does not break the kernel or the launcher.
# Matplotlib's and IPython's files go in TMPDIR: in the sandbox, a tmpfs (they create their directories).
_DIRS = ("work", "kernel", "kernel/tmp", "kernel/runtime")


def working_directory(workdir):
    """Where the graded notebook runs (its cwd and HOME)."""
    return os.path.join(workdir, "work")


def runtime_dir(workdir):
    """The kernel's sockets and connection file: on the grader's disk, writable from the sandbox."""
    return os.path.join(workdir, "kernel", "runtime")


def runtime_overfull(workdir):
    """Why the sockets' directory holds more than a kernel needs (RUNTIME_ENTRIES, RUNTIME_BYTES), or ""."""
    entries, size = 0, 0
    try:
        with os.scandir(runtime_dir(workdir)) as it:
            for entry in it:
                entries += 1
                size += entry.stat(follow_symlinks=False).st_size if entry.is_file(follow_symlinks=False) else 0
                if entries > RUNTIME_ENTRIES or size > RUNTIME_BYTES:
                    return (f"more than {RUNTIME_ENTRIES} files or {RUNTIME_BYTES // 2**20} MiB in the directory of "
                            "its kernel's sockets, on the grader's disk")
    except OSError as exc:  # the kernel's own user may chmod or remove it: the watch must go on all the same
        return f"the directory of its kernel's sockets could not be read ({exc.strerror})"
    return ""


def kernel_env(workdir, preload_dynamo=True, threads=0, channel_fd=None):
    """Environment of the graded kernel: everything writable lives in its own directory; channel_fd: the write end of
    the probes' pipe (run/channel.py), passed into the kernel."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}
    if channel_fd is not None:
        env[FD_VARIABLE] = str(channel_fd)
    env["DP_COURSE_PRELOAD_DYNAMO"] = "1" if preload_dynamo else "0"
    # Imported by the kernel before any student cell (and by its forkserver): probe_runtime keeps the originals of
    # what the probe cells call, and puts them back before each (probe_runtime._ORIGINALS).
    env["DP_COURSE_PRELOAD"] = "helpers.grading.run.probe_runtime"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch reads it at import (grade.kernel_threads says why)
    kernel = os.path.join(workdir, "kernel")
    env.update(HOME=working_directory(workdir), TMPDIR=os.path.join(kernel, "tmp"),
               MPLCONFIGDIR=os.path.join(kernel, "tmp", "mpl"), IPYTHONDIR=os.path.join(kernel, "tmp", "ipython"),
               JUPYTER_RUNTIME_DIR=runtime_dir(workdir), GLOO_SOCKET_IFNAME="lo",
               MPLBACKEND="module://matplotlib_inline.backend_inline", PYTHONUNBUFFERED="1")
    return env


class SandboxKernelManager(AsyncKernelManager):
    """A KernelManager whose kernel can read its connection file after dropping to nobody, and sees no variable of
    the grader's environment but those kernel_env passes on."""

    drop_user = False
    cgroup = None  # the kernel's pids cgroup
    memory = None  # and its memory cgroup (the same directory on cgroup v2)
    pass_fds = ()  # the probes' pipe: kept open in the kernel (Popen closes every other descriptor)

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        return await super()._async_launch_kernel(kernel_cmd, **kw, pass_fds=self.pass_fds)

    async def _async_pre_start_kernel(self, **kw):
        # jupyter_client adds the kernelspec's env to the grader's own os.environ: a submission could read the
        # instructor's shell (API tokens) and put it in a failure message, which goes back in its feedback.
        kw["env"] = dict(self.kernel_spec.env)
        return await super()._async_pre_start_kernel(**kw)

    def write_connection_file(self, **kwargs):
        super().write_connection_file(**kwargs)
        if self.drop_user:
            os.chown(self.connection_file, NOBODY_UID, NOBODY_GID)


# With no network there is no DNS: c10d's store names each client (seen as ::ffff:127.0.0.1 on a dual-stack
# socket) and, without these lines, warns "The hostname of the client socket cannot be retrieved" per rank.
_HOSTS = "127.0.0.1 localhost grading\n::1 localhost ip6-localhost grading\n::ffff:127.0.0.1 localhost\n"


def hosts_file(workdir):
    """The sandbox's /etc/hosts."""
    return os.path.join(workdir, "kernel", "hosts")


def prepare_workdir(workdir, drop_user):
    """Create the kernel's directories and its /etc/hosts; hand them to nobody when the kernel runs as nobody."""
    for sub in _DIRS:
        path = os.path.join(workdir, sub)
        os.makedirs(path, exist_ok=True)
        if drop_user:
            os.chown(path, NOBODY_UID, NOBODY_GID)
    with open(hosts_file(workdir), "w") as f:
        f.write(_HOSTS)


def make_kernel_manager(workdir, limits, channel_fd=None):
    """A kernel manager for one submission (not started yet); channel_fd: the probes' pipe, kept open in the kernel."""
    runtime = runtime_dir(workdir)
    # The kernel's ipc sockets live there, and AF_UNIX paths hold at most 107 bytes.
    if len(os.path.join(runtime, "kernel-ipc-99999")) > 100:
        raise ValueError(f"the working directory {workdir!r} is too long for the kernel's unix sockets: "
                         "grade in a shorter one, e.g. under /tmp")
    prepare_workdir(workdir, limits.fences.drop_user)
    km = SandboxKernelManager(transport="ipc", ip=os.path.join(runtime, "kernel-ipc"),
                              connection_file=os.path.join(runtime, "kernel.json"))
    km.drop_user = limits.fences.drop_user
    km.pass_fds = () if channel_fd is None else (channel_fd,)
    argv = kernel_argv(workdir, limits)
    name = f"{PREFIX}{os.getpid()}-{next(_serial)}"
    if limits.fences.pids:
        km.cgroup = PidsCgroup(name, limits.max_tasks)
    if limits.fences.memory_cgroups and limits.kernel_memory_bytes:
        km.memory = MemoryCgroup(name, limits.kernel_memory_bytes)
    groups = [group for group in (km.cgroup, km.memory) if group is not None]
    if groups:
        argv = groups[0].enter_argv(*groups[1:]) + argv
    # "message": the kernel interrupts itself. A signal would reach bwrap, outside the kernel's session.
    env = kernel_env(workdir, limits.preload_dynamo, limits.threads, channel_fd)
    km._kernel_spec = KernelSpec(argv=argv, env=env, display_name="graded", language="python",
                                 interrupt_mode="message")
    return km


_serial = itertools.count()


def kill_session(km):
    """Kill the kernel's sandbox: bwrap, and with it every process inside (ranks, daemons)."""
    process = getattr(km.provisioner, "process", None) if km.provisioner else None
    if process is not None:
        try:
            os.killpg(os.getpgid(process.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for group in (km.cgroup, km.memory):  # what left the session (setsid daemons) without a sandbox to die with
        if group is not None:
            group.kill()
