"""Start torchrun jobs from a notebook cell: output streamed live, a timeout, and no process left behind.

    codes, output = run({"node 0": command_0, "node 1": command_1}, timeout=120)

Every command starts at once, in a session of its own (start_new_session), so its process group holds the
torchrun agent and every worker the agent starts. Each line a job prints appears in the cell as it comes,
prefixed with the job's label. When a job ends, on a timeout, on an interrupt or on an error, we signal that
process group, by the id of the process we started (SIGTERM, then SIGKILL after KILL_GRACE_S): nothing else is
touched, and nothing of ours survives the call.

A line's paths of this machine are shown as the reader's own would be: the working directory's prefix is dropped
(`File "chapters/ops/resumable.py"`), and so is a Python installation's `.../site-packages/` (`torch/_tensor.py`,
as torch's own log lines name its files), in what the cell prints and in the lines `run` returns.
"""
import os
import queue
import re
import signal
import subprocess
import threading
import time

KILL_GRACE_S = 5.0
# One thread per rank: the ranks share the cores. (torchrun starts its workers with `python -u`, unbuffered, and
# they share one pipe: the scripts write each line in one write, train_script.say, or lines interleave.)
ENV = {"OMP_NUM_THREADS": "1"}


# An installed package's folder, up to and including site-packages/ (or Debian's dist-packages/), in any path.
INSTALLED = re.compile(r"[^\s\"'(\[]*[/\\](?:site|dist)-packages[/\\]")


def relative(line, cwd):
    """The line with this machine's paths shortened: cwd's prefix and an installation's site-packages/ dropped."""
    line = INSTALLED.sub("", line)
    for folder in {os.path.abspath(cwd), os.path.realpath(cwd)}:
        line = line.replace(folder.rstrip(os.sep) + os.sep, "")
    return line


def _pump(label, stream, lines, cwd):
    """Forward a job's output, line by line, paths made relative, to the queue; None marks its end."""
    for line in stream:
        lines.put((label, relative(line.rstrip("\n"), cwd)))
    lines.put((label, None))


def stop(process):
    """End the process group of a job we started: SIGTERM, then SIGKILL; return once the group is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)     # the group's id is the id of the process we started
        except ProcessLookupError:
            break                           # no process of the group is left
        if _group_ended(process, KILL_GRACE_S):
            break
    process.wait()


def _group_ended(process, grace):
    """Wait up to grace seconds for every process of the job's group to end (the job itself reaped here)."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        process.poll()
        try:
            os.killpg(process.pid, 0)       # signal 0: only asks whether the group still has a process
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def run(commands, timeout, env=None, cwd=None):
    """Run {label: argv} concurrently, streaming output; return ({label: exit code}, {label: [lines]})."""
    environment = {**os.environ, **ENV, **(env or {})}
    lines, output, processes = queue.Queue(), {label: [] for label in commands}, {}
    deadline = time.monotonic() + timeout
    try:
        for label, argv in commands.items():
            processes[label] = subprocess.Popen(
                [str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=environment, cwd=cwd, start_new_session=True)
            threading.Thread(target=_pump, args=(label, processes[label].stdout, lines, cwd or os.getcwd()),
                             daemon=True).start()
        open_streams, ended = len(commands), set()
        while open_streams:
            try:
                label, line = lines.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    tail = "\n".join(f"[{k}] {x}" for k, v in output.items() for x in v[-5:])
                    raise TimeoutError(f"the jobs {list(commands)} ran over timeout={timeout} s and were stopped; "
                                       f"raise the timeout on a slow machine. Last lines:\n{tail}") from None
                # A job that has exited but left a process in its session (a worker the agent did not reap) keeps
                # the pipe open, and we would wait for the timeout: end the session now.
                for done in set(processes) - ended:
                    if processes[done].poll() is not None:
                        ended.add(done)
                        stop(processes[done])
                continue
            if line is None:
                open_streams -= 1
                continue
            output[label].append(line)
            print(f"[{label}] {line}" if len(commands) > 1 else line, flush=True)
        for process in processes.values():
            process.wait(max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes.values():
            stop(process)
    return {label: p.returncode for label, p in processes.items()}, output
