"""A kernel per submission, fenced without containers: own directory and HOME, memory limit, and,
where the machine allows it, no network and an unprivileged user.

What each fence does, and what it does not (also in the README):
- a fresh working directory and HOME per submission: files the code writes or deletes are its own;
  the repository and the grader's output directory are not its working directory;
- `prlimit --as`: a memory bomb becomes MemoryError (or torch's "can't allocate memory") in that
  kernel, not an out-of-memory kill of the machine;
- `unshare -n` (root only): a network namespace with nothing but loopback, so no network at all;
- a private mount namespace (root only): the repository and the Python environment read-only, and
  empty tmpfs over the directories the code must not see: solutions/, the probes, the other
  submissions, the grader's output;
- `setpriv` to nobody (root only, and only when nobody can run the interpreter: a Python under
  /root cannot be): the code cannot read files only root can, nor write the repository;
- the kernel runs in its own session; when it ends, everything in that session is killed, workers
  started by `%%ranks`/`launch` included.
Not protected: CPU time beyond the timeouts' granularity, disk space, reading world-readable files
(the public repository, including its default probes), and anything needing a kernel exploit.
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

NOBODY_UID = NOBODY_GID = 65534


def can_isolate_network():
    """True when `unshare -n` works here (root, or a kernel allowing it)."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "-n", "--", "ip", "link", "set", "lo", "up"], capture_output=True)
    return probe.returncode == 0


def can_drop_user():
    """True when we are root, setpriv exists and nobody can run this interpreter."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups",
                            "--", sys.executable, "-c", "import os; print(os.__file__)"],
                           capture_output=True, text=True)
    # A Python under /root starts as nobody but silently picks up another standard library.
    return probe.returncode == 0 and probe.stdout.strip() == os.__file__


def namespace_script(hidden_dirs, readonly_dirs):
    """Shell run inside the new namespaces: hide directories, bring loopback up, exec the kernel."""
    readonly = "".join(f"mount --bind {shlex.quote(d)} {shlex.quote(d)} && "
                       f"mount -o remount,bind,ro {shlex.quote(d)} && " for d in readonly_dirs)
    hide = "".join(f"mount -t tmpfs -o size=1m,mode=000 tmpfs {shlex.quote(d)} && " for d in hidden_dirs)
    # Mounts must not propagate back to the host; loopback starts down in a new network namespace.
    return f'mount --make-rprivate / && {readonly}{hide}ip link set lo up && exec "$@"'


def kernel_argv(memory_bytes, *, isolate_network, drop_user, hidden_dirs=(), readonly_dirs=()):
    """The command that starts an ipykernel inside the fences."""
    argv = []
    if isolate_network:
        hidden = [d for d in hidden_dirs if os.path.isdir(d)]
        readonly = [d for d in readonly_dirs if os.path.isdir(d)]
        argv += ["unshare", "-n", "-m", "--", "sh", "-c", namespace_script(hidden, readonly), "sh"]
    if memory_bytes and shutil.which("prlimit"):
        argv += ["prlimit", f"--as={int(memory_bytes)}", "--"]
    if drop_user:  # last, so that the interpreter is what nobody executes (the limit is inherited)
        argv += ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", "--"]
    return argv + [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


# The student's code works in work/ (its cwd and HOME); the kernel's own files live beside it, so
# that emptying the working directory does not break the kernel or the launcher.
_DIRS = ("work", "kernel", "kernel/tmp", "kernel/mpl", "kernel/ipython", "kernel/runtime")


def working_directory(workdir):
    """Where the graded notebook runs (its cwd and HOME)."""
    return os.path.join(workdir, "work")


def kernel_env(workdir):
    """Environment of the graded kernel: everything writable lives in its own directory."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}
    kernel = os.path.join(workdir, "kernel")
    env.update(HOME=working_directory(workdir), TMPDIR=os.path.join(kernel, "tmp"),
               MPLCONFIGDIR=os.path.join(kernel, "mpl"), IPYTHONDIR=os.path.join(kernel, "ipython"),
               JUPYTER_RUNTIME_DIR=os.path.join(kernel, "runtime"), GLOO_SOCKET_IFNAME="lo",
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    return env


class SandboxKernelManager(AsyncKernelManager):
    """A KernelManager whose kernel can read its connection file after dropping to nobody."""

    drop_user = False

    def write_connection_file(self, **kwargs):
        super().write_connection_file(**kwargs)
        if self.drop_user:
            os.chown(self.connection_file, NOBODY_UID, NOBODY_GID)


def prepare_workdir(workdir, drop_user):
    """Create the kernel's directories; hand them to nobody when the kernel runs as nobody."""
    for sub in _DIRS:
        path = os.path.join(workdir, sub)
        os.makedirs(path, exist_ok=True)
        if drop_user:
            os.chown(path, NOBODY_UID, NOBODY_GID)


def make_kernel_manager(workdir, memory_bytes, *, isolate_network, drop_user, hidden_dirs=(), readonly_dirs=()):
    """A kernel manager for one submission (not started yet)."""
    runtime = os.path.join(workdir, "kernel", "runtime")
    # The kernel's ipc sockets live there, and AF_UNIX paths hold at most 107 bytes.
    if len(os.path.join(runtime, "kernel-ipc-99999")) > 100:
        raise ValueError(f"the working directory {workdir!r} is too long for the kernel's unix sockets: "
                         "grade in a shorter one, e.g. under /tmp")
    prepare_workdir(workdir, drop_user)
    km = SandboxKernelManager(transport="ipc", ip=os.path.join(runtime, "kernel-ipc"),
                              connection_file=os.path.join(runtime, "kernel.json"))
    km.drop_user = drop_user
    km._kernel_spec = KernelSpec(argv=kernel_argv(memory_bytes, isolate_network=isolate_network,
                                                  drop_user=drop_user, hidden_dirs=hidden_dirs,
                                                  readonly_dirs=readonly_dirs),
                                 env=kernel_env(workdir), display_name="graded", language="python")
    return km


def kill_session(km):
    """Kill every process of the kernel's session (the kernel, its forkserver, any rank)."""
    process = getattr(km.provisioner, "process", None) if km.provisioner else None
    if process is None:
        return
    try:
        os.killpg(os.getpgid(process.pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
