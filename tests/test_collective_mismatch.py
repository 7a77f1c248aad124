"""Ranks that disagree on a collective: the crash report, check_collectives=True, and the missing __main__ guard."""
import inspect
import os
import subprocess
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from helpers import CollectiveHang, CollectiveMismatch, LaunchError, RankFailed, launch
from helpers.launcher.magic import parse_line, ranks
from tests.processes import fresh_interpreter_env

# The rank functions below travel by value: by reference every rank would import this module, and pytest with it
# (0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(90)


def different_sizes():
    t = torch.ones(4 + dist.get_rank())  # rank 0: 4 elements, rank 1: 5, ...
    dist.all_reduce(t)
    return t.tolist()


def different_reduce_ops():
    t = torch.tensor([1.0, 1.0, 0.0, 0.0]) if dist.get_rank() == 0 else torch.ones(4)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX)
    return t.tolist()


def different_collectives():
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def line_of(fn, text):
    """The number of the line of fn's source that contains text."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_crash_inside_a_collective_names_every_ranks_call():
    with pytest.raises(RankFailed) as info:
        launch(different_sizes, 2, hang_timeout=20)
    message = str(info.value)
    assert f"rank {info.value.rank} was killed by signal 6 (SIGABRT) inside a collective" in message, message
    assert info.value.exitcode == -6
    for rank, size in ((0, 4), (1, 5)):
        assert (f"rank {rank}: all_reduce(tensor=float32[{size}], op=SUM) at test_collective_mismatch.py, line "
                f"{line_of(different_sizes, 'all_reduce')}, in different_sizes: dist.all_reduce(t)") in message, message
    assert "The calls differ in tensor: float32[4] on rank 0, float32[5] on rank 1." in message
    # Gloo's own words, which rank 0 printed to stderr just before abort() (the kernel keeps the end of it)
    assert "Received data size doesn't match expected size" in message and "(gloo/transport/tcp/" in message
    assert "check_collectives=True" in message


def test_without_the_check_a_reduce_op_mismatch_is_silently_wrong():
    # Why the check exists: Gloo raises nothing, and both ranks get a result that is neither the SUM nor the MAX.
    assert launch(different_reduce_ops, 2) == [[2.0, 2.0, 1.0, 1.0]] * 2


@pytest.mark.parametrize("world_size", [2, 3])
def test_check_names_both_shapes_and_lines(world_size):
    with pytest.raises(CollectiveMismatch) as info:
        launch(different_sizes, world_size, check_collectives=True)
    message = str(info.value)
    assert message.startswith("the ranks called different collectives as collective #1 on the default group")
    for rank in range(world_size):
        assert (f"rank {rank}: all_reduce(tensor=float32[{4 + rank}], op=SUM) at test_collective_mismatch.py, "
                f"line {line_of(different_sizes, 'all_reduce')}, in different_sizes: dist.all_reduce(t)") in message
    assert "They differ in tensor: float32[4] on rank 0, float32[5] on rank 1" in message
    assert isinstance(info.value, LaunchError)
    assert [c["rank"] for c in info.value.calls] == list(range(world_size))


def test_check_names_the_reduce_ops():
    with pytest.raises(CollectiveMismatch) as info:
        launch(different_reduce_ops, 2, check_collectives=True)
    message = str(info.value)
    line = line_of(different_reduce_ops, "all_reduce")
    assert f"rank 0: all_reduce(tensor=float32[4], op=SUM) at test_collective_mismatch.py, line {line}" in message
    assert f"rank 1: all_reduce(tensor=float32[4], op=MAX) at test_collective_mismatch.py, line {line}" in message
    assert "They differ in op: SUM on rank 0, MAX on rank 1." in message


def test_check_turns_a_hang_into_a_mismatch():
    start = time.monotonic()
    with pytest.raises(CollectiveMismatch) as info:
        launch(different_collectives, 2, hang_timeout=30, check_collectives=True)
    assert time.monotonic() - start < 20, "the mismatch waited for a timeout"
    message = str(info.value)
    assert ("rank 0: all_reduce(tensor=float32[4], op=SUM) at test_collective_mismatch.py, line "
            f"{line_of(different_collectives, 'all_reduce')}") in message
    assert ("rank 1: broadcast(tensor=float32[4], root=0) at test_collective_mismatch.py, line "
            f"{line_of(different_collectives, 'broadcast')}") in message
    assert "They differ in the collective: all_reduce on rank 0, broadcast on rank 1." in message


def different_roots():
    t = torch.full((2,), float(dist.get_rank()))
    dist.broadcast(t, src=dist.get_rank())  # every rank thinks it is the source


def different_dtypes():
    dist.all_reduce(torch.ones(2, dtype=torch.float32 if dist.get_rank() == 0 else torch.float64))


@pytest.mark.parametrize("fn, difference", [
    (different_roots, "They differ in root: 0 on rank 0, 1 on rank 1."),  # TORCH_DISTRIBUTED_DEBUG=DETAIL hangs
    (different_dtypes, "They differ in tensor: float32[2] on rank 0, float64[2] on rank 1."),
])
def test_check_names_roots_and_dtypes(fn, difference):
    with pytest.raises(CollectiveMismatch) as info:
        launch(fn, 2, hang_timeout=30, check_collectives=True)
    assert difference in str(info.value), str(info.value)


def skipped_all_reduce():
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() != 1:
        dist.all_reduce(torch.ones(1))


def test_check_waiting_for_a_rank_that_returned_is_a_deadlock_at_once():
    # Rank 0 waits in the check (before the backend counts the collective): still reported as all_reduce #2.
    start = time.monotonic()
    with pytest.raises(CollectiveHang) as info:
        launch(skipped_all_reduce, 2, hang_timeout=30, check_collectives=True)
    assert time.monotonic() - start < 20, "the deadlock was reported only after hang_timeout"
    assert str(info.value).startswith("deadlock: rank 1 returned from its function after 1 collective(s), while "
                                      "rank 0 waits in all_reduce #2"), str(info.value)


def many_collectives():
    """Matching calls of every kind, on the world, on a subgroup, from Python and from DDP's C++ reducer."""
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.broadcast(t, src=n - 1)
    gathered = torch.empty(n)
    dist.all_gather_into_tensor(gathered, torch.tensor([float(rank)]))
    shard = torch.empty(1)
    dist.reduce_scatter_tensor(shard, torch.arange(n, dtype=torch.float32))
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank})
    dist.barrier()
    if n > 1:
        pair = dist.new_group([0, 1])
        if rank < 2:
            dist.all_reduce(t, group=pair)
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    model(torch.full((2, 3), float(rank))).sum().backward()  # gradient all_reduce issued from C++
    return t.item(), gathered.tolist(), shard.item(), [o["rank"] for o in objects], model.module.weight.grad.tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_check_lets_matching_collectives_through_unchanged(world_size):
    checked = launch(many_collectives, world_size, check_collectives=True)
    assert checked == launch(many_collectives, world_size)


def open_ledgers():
    from helpers import comm

    return len(comm._active)


def test_check_costs_nothing_when_off():
    # Off, no ledger is open in the rank, so no collective passes through Python; on, one is.
    assert launch(open_ledgers, 2) == [0, 0]
    assert launch(open_ledgers, 2, check_collectives=True) == [1, 1]


def all_reduces(count):
    for _ in range(count):
        dist.all_reduce(torch.ones(1))


def test_check_leaves_one_key_per_rank_in_the_store():
    from helpers.launch import runtime

    launch(all_reduces, 2, args=(1,))
    store = runtime().store
    before = store.num_keys()
    launch(all_reduces, 2, args=(50,))
    plain = store.num_keys() - before
    launch(all_reduces, 2, args=(50,), check_collectives=True)
    checked = store.num_keys() - before - plain
    assert checked - plain == 2, f"{checked - plain} keys more with the check after 50 collectives; expected 2"


def test_check_collectives_must_be_a_bool():
    with pytest.raises(TypeError, match="check_collectives='yes' must be True or False"):
        launch(all_reduces, 2, args=(1,), check_collectives="yes")


def test_ranks_magic_checks_collectives_and_names_the_cell_line():
    assert parse_line("2 --check-collectives").check_collectives and not parse_line("2").check_collectives
    cell = "import torch, torch.distributed as dist\nt = torch.ones(4 + dist.get_rank())\ndist.all_reduce(t)\n"
    with pytest.raises(CollectiveMismatch) as info:
        ranks("2 --check-collectives", cell, {}, label="In [3]")
    message = str(info.value)
    assert "rank 0: all_reduce(tensor=float32[4], op=SUM) at In [3], line 4: dist.all_reduce(t)" in message, message


NO_GUARD = """
import torch.distributed as dist
from helpers import launch

def rank():
    return dist.get_rank()

print(launch(rank, 2))
"""


def run_script(tmp_path, source, **env):
    script = tmp_path / "train.py"
    script.write_text(source)
    # No torch._dynamo in the script's forkserver: no rank here needs it, and it costs 3 CPU-s per script.
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=fresh_interpreter_env(PYTHONPATH=os.getcwd(), DP_COURSE_PRELOAD_DYNAMO="0", **env))


def test_missing_main_guard_says_what_to_add(tmp_path):
    done = run_script(tmp_path, NO_GUARD)
    assert done.returncode == 1
    last = done.stderr[done.stderr.index("helpers.errors.LaunchError"):]
    assert last.startswith("helpers.errors.LaunchError: launch() is called at the top level of train.py (line 8: "
                           "print(launch(rank, 2))), outside an `if __name__ == \"__main__\":` block."), last
    assert '    if __name__ == "__main__":\n        print(launch(rank, 2))\n' in last
    assert "bootstrapping phase" not in done.stderr  # refused before any rank started


# What the script reports to stderr about its temp dirs: Python's (long, from TMPDIR) and multiprocessing's, which
# holds the forkserver's socket.
TEMP_DIRS = """
    import multiprocessing.util, sys, tempfile
    long_tmp, short_socket_dir = len(tempfile.gettempdir()) > 100, len(multiprocessing.util.get_temp_dir()) <= 70
    print("temp dirs:", long_tmp, short_socket_dir, file=sys.stderr)
"""


def test_guarded_script_runs_even_from_a_long_tmpdir(tmp_path):
    # One script run, two claims: a guarded script runs, and a long TMPDIR (macOS's /var/folders/..., a grading
    # sandbox's) does not break the forkserver: AF_UNIX socket paths hold at most 107 bytes.
    guarded = NO_GUARD.replace("print(launch(rank, 2))",
                               'if __name__ == "__main__":\n    print(launch(rank, 2))' + TEMP_DIRS.rstrip())
    long_dir = tmp_path / ("d" * 90)
    long_dir.mkdir()
    done = run_script(tmp_path, guarded, TMPDIR=str(long_dir))
    assert done.returncode == 0 and done.stdout == "[0, 1]\n", done.stderr[-2000:]
    assert "temp dirs: True True\n" in done.stderr, done.stderr[-2000:]


def test_rank_that_dies_while_starting_points_at_the_guard(tmp_path):
    # Were the script unreadable to the launcher's check, the ranks themselves would refuse, and the kernel
    # would name the cause of their exit code 1.
    bypass = NO_GUARD.replace("from helpers import launch",
                              "from helpers import launch\nimport helpers.launcher.main_guard\n"
                              "helpers.launcher.main_guard._guarded = lambda path, lineno: True")
    done = run_script(tmp_path, bypass)
    assert "LaunchError: launch() is called at the top level of train.py" in done.stderr  # printed by a rank
    report = done.stderr[done.stderr.index("helpers.errors.RankFailed"):]
    assert "exited with code 1 while starting, before running your function" in report, report
    assert 'move that under `if __name__ == "__main__":`' in report


def test_hang_report_says_how_the_waiting_ranks_calls_differ():
    # On 3 ranks the same mistake does not crash: Gloo's ring lets rank 0 finish (with a wrong result), the others wait.
    with pytest.raises(CollectiveHang) as info:
        launch(different_sizes, 3, hang_timeout=3)
    message = str(info.value)
    assert ("rank 1: blocked in all_reduce #1, called at test_collective_mismatch.py, line "
            f"{line_of(different_sizes, 'all_reduce')}") in message, message
    assert ("The waiting ranks' calls differ in tensor: float32[5] on rank 1, float32[6] on rank 2; "
            "launch(..., check_collectives=True) stops at the first call that differs.") in message, message
