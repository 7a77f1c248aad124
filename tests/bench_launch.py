"""`make bench`: time "init a 4-rank Gloo group, all_reduce one tensor, return" three ways.

    python -m tests.bench_launch [--world-size 4] [--repeats 10]

Ways: helpers.launch with a warm forkserver; torch.multiprocessing.spawn; raw os.fork.
All three rendezvous through a TCPStore hosted by this process, so they differ only in how
processes start and how the function and result travel. Prints medians and ratios.
Raw fork runs in a separate clean parent that imported torch and started no threads: forking
this process, which hosts the store's threads, deadlocks the children (the reason launch uses a
forkserver).
"""
import argparse
import datetime
import json
import os
import pickle
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import launch


def all_reduce_once():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def join_and_all_reduce(rank, world_size, port, prefix):
    """The same work for spawn and fork: join through the store, all_reduce, leave."""
    torch.set_num_threads(1)
    store = dist.PrefixStore(prefix, dist.TCPStore("127.0.0.1", port, is_master=False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    value = all_reduce_once()
    dist.destroy_process_group()
    return value


def spawn_entry(rank, world_size, port, prefix):
    join_and_all_reduce(rank, world_size, port, prefix)


def run_spawn(world_size, store, call):
    mp.spawn(spawn_entry, args=(world_size, store.port, f"spawn{call}/"), nprocs=world_size)


def run_fork(world_size, port, call):
    pids, reads = [], []
    for rank in range(world_size):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            value = join_and_all_reduce(rank, world_size, port, f"fork{call}/")
            os.write(w, pickle.dumps(value))
            os._exit(0)
        os.close(w)
        pids.append(pid)
        reads.append(r)
    values = []
    for pid, r in zip(pids, reads):
        values.append(pickle.loads(os.read(r, 1 << 16)))
        os.close(r)
        os.waitpid(pid, 0)
    assert values == [float(world_size)] * world_size


def fork_parent(world_size, port, repeats):
    """Runs in a clean subprocess: time raw forks, print the times as JSON."""
    times = []
    for call in range(repeats):
        start = time.perf_counter()
        run_fork(world_size, port, call)
        times.append(time.perf_counter() - start)
    print(json.dumps(times))


def run_fork_parent(world_size, store, repeats):
    command = [sys.executable, "-m", "tests.bench_launch", "--fork-parent", str(store.port),
               "--world-size", str(world_size), "--repeats", str(repeats)]
    times = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout)
    return statistics.median(times), times


def median_seconds(fn, repeats):
    times = []
    for call in range(repeats):
        start = time.perf_counter()
        fn(call)
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--fork-parent", type=int, metavar="PORT", help=argparse.SUPPRESS)
    options = parser.parse_args()
    n, repeats = options.world_size, options.repeats
    if options.fork_parent:
        return fork_parent(n, options.fork_parent, repeats)
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    launch(all_reduce_once, n)  # warm the forkserver: its one-off start is not what we compare
    results = {
        "launch (warm)": median_seconds(lambda call: launch(all_reduce_once, n), repeats),
        "raw fork": run_fork_parent(n, store, repeats),
        "torch.multiprocessing.spawn": median_seconds(lambda call: run_spawn(n, store, call), max(3, repeats // 3)),
    }
    print(f"{n} ranks, Gloo, median wall time of init + all_reduce + return:")
    for name, (median, times) in results.items():
        print(f"  {name:30s} {median * 1000:8.1f} ms   (runs: {len(times)}, min {min(times) * 1000:.1f} ms)")
    launch_s, fork_s, spawn_s = (results[k][0] for k in ("launch (warm)", "raw fork", "torch.multiprocessing.spawn"))
    print(f"spawn / launch = {spawn_s / launch_s:.1f}x   (target >= 20x)")
    print(f"launch / fork  = {launch_s / fork_s:.2f}x  (target <= 1.5x)")


if __name__ == "__main__":
    main()
