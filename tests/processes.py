"""What the test process owns: open file descriptors and the forkserver's live children."""
import multiprocessing.forkserver
import os


def fresh_interpreter_env(**extra):
    """os.environ, with extra, for an interpreter a test starts, less DP_COURSE_PRELOAD: tests/warm_kernels.py sets
    that for this worker's forkserver and the zygote's kernels, whose ranks run the labs' checks; a fresh forkserver
    would import every lab's checks (~1.6 CPU-s) for ranks that run none of them."""
    env = {name: value for name, value in os.environ.items() if name != "DP_COURSE_PRELOAD"}
    return {**env, **extra}


def open_fds():
    """Number of file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def children_of(pid):
    """Live (non-zombie) processes whose parent is pid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == pid and state != "Z":
            found.append(int(entry))
    return found


def forkserver_children():
    """Worker processes still alive under this process's forkserver."""
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    return children_of(pid) if pid else []
