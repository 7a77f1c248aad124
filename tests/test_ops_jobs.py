"""chapters/ops/jobs.py, which runs chapter 11's torchrun jobs: output streamed, a timeout, no process left behind.

Chapter 11 runs the real jobs (torchrun's restart after a killed rank, two agents as two nodes) under nbval; these
tests hold the runner's promises with jobs that cost nothing: a job whose child outlives it, a job that overruns.
"""
import argparse
import os
import sys
import time

import pytest

from chapters.ops import jobs

pytestmark = pytest.mark.timeout(60)

# Prints its pid, leaves a child sleeping in its session (as a torchrun agent leaves workers), then exits or waits.
JOB = ("import os, subprocess, sys, time\n"
       "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
       "print('started', os.getpid(), flush=True)\n"
       "time.sleep(float(sys.argv[1]))\n"
       "print('done', flush=True)\n")


def session_members(sid):
    """Pids of the live (not zombie) processes whose session id is sid."""
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(pid))
    return members


def job(seconds):
    return [sys.executable, "-c", JOB, str(seconds)]


def test_a_finished_job_leaves_no_process_and_its_output_is_labelled(capsys):
    codes, output = jobs.run({"node 0": job(0), "node 1": job(0.2)}, timeout=30)
    assert codes == {"node 0": 0, "node 1": 0}
    printed = capsys.readouterr().out
    assert "[node 0] done" in printed and "[node 1] done" in printed
    for label in output:
        sid = int(output[label][0].split()[1])  # the job leads its session: its pid is the session id
        assert output[label][-1] == "done"
        assert session_members(sid) == [], f"{label}: its child outlived the job"


def test_a_job_over_its_timeout_is_stopped_with_everything_it_started(capsys):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ran over timeout=2 s and were stopped; raise the timeout"):
        jobs.run({"slow": job(120)}, timeout=2)
    assert time.monotonic() - start < 2 + jobs.KILL_GRACE_S + 5
    sid = int(capsys.readouterr().out.split()[1])
    assert session_members(sid) == []


def test_an_empty_checkpoint_directory_is_refused_with_what_to_give():
    # pathlib reads "" as ".": resumable.py's --ckpt "" wrote step_* directories into the repository's root.
    from chapters.ops.train_script import checkpoint_dir

    with pytest.raises(argparse.ArgumentTypeError, match=r"give a directory for the checkpoints, e\.g\. --ckpt "):
        checkpoint_dir(" ")
    assert str(checkpoint_dir("artifacts/ops/ckpt")) == "artifacts/ops/ckpt"
