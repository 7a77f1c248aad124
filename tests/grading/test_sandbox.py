"""The sandbox's fences, checked directly: also for an instructor who is not root (user namespaces)."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers.grading.run.sandbox import available_fences, bwrap_argv, prepare_workdir

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not available_fences().sandbox, reason="bubblewrap does not run here")]

# What a kernel would try: its PID, the network, the hidden directory, writing to the read-only one.
PROBE = '''
import os, socket
print("pid", os.getpid(), "uid", os.getuid())
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    print("network yes")
except OSError:
    print("network no")
print("hidden", os.listdir(os.environ["HIDDEN"]))
try:
    open(os.path.join(os.environ["HIDDEN"], "x"), "w")
    print("hidden write yes")
except OSError:
    print("hidden write no")
try:
    open(os.path.join(os.environ["READONLY"], "x"), "w")
    print("write yes")
except OSError:
    print("write no")
'''


@pytest.fixture
def tmp_path():
    """Under /tmp, readable by nobody (pytest's own tmp_path is private to root)."""
    with tempfile.TemporaryDirectory(prefix="sandbox-") as path:
        os.chmod(path, 0o755)
        yield __import__("pathlib").Path(path)


def _run(tmp_path, prefix=()):
    readonly, hidden, work = tmp_path / "repo", tmp_path / "repo" / "solutions", tmp_path / "w"
    hidden.mkdir(parents=True)
    (hidden / "answer.ipynb").write_text("{}")
    prepare_workdir(str(work), drop_user=False)
    for path in (work, *work.iterdir()):
        shutil.chown(path, 65534, 65534) if prefix else None
    python, pythons = ("/usr/bin/python3", []) if prefix else (sys.executable, [sys.prefix, sys.base_prefix])
    argv = [*prefix, *bwrap_argv(str(work), [str(readonly), *pythons], [str(hidden)]), python, "-c", PROBE]
    env = {"HIDDEN": str(hidden), "READONLY": str(readonly), "PATH": "/usr/bin:/bin"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)


def test_fences_hold(tmp_path):
    done = _run(tmp_path)
    assert done.stdout.split("\n")[1:] == ["network no", "hidden []", "hidden write no", "write no", ""], (
        done.stdout + done.stderr)
    assert done.stdout.startswith("pid 2 "), "the kernel must be in its own PID namespace"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root to become nobody")
def test_fences_hold_for_a_user_who_is_not_root(tmp_path):
    # bwrap then makes an unprivileged user namespace itself; /usr/bin/python3, as nobody cannot run ours.
    done = _run(tmp_path, prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"))
    assert done.stdout.split("\n")[1:] == ["network no", "hidden []", "hidden write no", "write no", ""], (
        done.stdout + done.stderr)
    assert done.stdout.startswith("pid 2 uid 65534"), done.stdout + done.stderr


def test_graded_kernels_share_the_cores_between_jobs(tmp_path):
    # One intra-op thread pool per kernel over all cores, two kernels at once: they spin-wait on each other.
    from helpers.grading.grade import kernel_threads
    from helpers.grading.run.sandbox import kernel_env

    cores = os.cpu_count()
    assert kernel_threads(1) == cores and kernel_threads(cores) == 1 and kernel_threads(4 * cores) == 1
    assert kernel_env(str(tmp_path), threads=3)["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in kernel_env(str(tmp_path))  # 0: torch's own default



# A submission that fills the disk, where the grader's results and the next students' kernels live. It writes
# 3 MiB into every place a kernel could write (its working directory, TMPDIR, the directory of the kernel's sockets,
# the kernel's own directory) and to its stderr, which is the kernel's log on the grader's disk. Before the fences
# below, all 15 MiB landed on the grader's disk.
FILL_DISK = '''
import os
places = {"work": ".", "tmpdir": os.environ["TMPDIR"], "runtime": os.environ["JUPYTER_RUNTIME_DIR"],
          "kernel": os.path.dirname(os.environ["TMPDIR"])}
chunk = b"x" * 2**20
for name, path in places.items():
    wrote, why = 0, "-"
    try:
        with open(os.path.join(path, "fill"), "wb", buffering=0) as f:
            for _ in range(3):
                f.write(chunk)
                wrote += 1
    except OSError as exc:
        why = exc.strerror
    print(name, wrote, why, flush=True)
wrote, why = 0, "-"
try:
    for _ in range(3):
        os.write(2, chunk)
        wrote += 1
except OSError as exc:
    why = exc.strerror
print("log", wrote, why, flush=True)
'''


def _disk_use(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_a_submission_cannot_fill_the_graders_disk(tmp_path):
    from helpers.grading.run.sandbox import kernel_env, runtime_overfull

    # The grader's fences (sandbox.kernel_argv) with smaller caps: 1.5 MiB each tmpfs (the second write is cut
    # short, the third refused), 2 MiB each file.
    work, log, tmpfs, cap = tmp_path / "w", tmp_path / "kernel.log", 3 * 2**19, 2 * 2**20
    prepare_workdir(str(work), drop_user=False)
    before = _disk_use(work)  # the sandbox's /etc/hosts
    argv = ["prlimit", f"--fsize={cap}", "--", *bwrap_argv(str(work), [sys.prefix, sys.base_prefix], [], tmpfs),
            sys.executable, "-c", FILL_DISK]
    with open(log, "wb") as stderr:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=30,
                              env=kernel_env(str(work)))
    assert done.stdout.splitlines() == [
        "work 2 No space left on device", "tmpdir 2 No space left on device", "runtime 2 File too large",
        "kernel 0 Read-only file system", "log 2 File too large"], done.stdout
    # On the grader's disk: 2 MiB of log, and 2 MiB in the sockets' directory, which the grader's watch kills for.
    assert (_disk_use(work) - before, log.stat().st_size) == (cap, cap)
    assert "more than 64 files or 1 MiB in the directory of its kernel's sockets" in runtime_overfull(str(work))
    # A kernel running as the grader's own user can remove the directory (or chmod it): the watch says so, it does
    # not die (its thread also enforces the cell's time limit).
    shutil.rmtree(work / "kernel" / "runtime")
    assert "could not be read (No such file or directory)" in runtime_overfull(str(work))
