"""What check_collectives=True costs per collective, next to TORCH_DISTRIBUTED_DEBUG=DETAIL's check.

    python -m tests.bench_collective_check [--calls 2000] [--world-sizes 2 4]

Every rank times each of `calls` all_reduces of one float32 (after 50 untimed ones), three ways, each in one
launch: plain; launch(..., check_collectives=True); and on a group made under DebugLevel.DETAIL (what
TORCH_DISTRIBUTED_DEBUG=DETAIL gives every group: a ProcessGroupWrapper that all-gathers a fingerprint of
each collective over a helper Gloo group before running it). Prints the median per call, pooled over ranks,
and each way's extra cost over plain. A one-element tensor makes the collective itself as cheap as it gets,
so the extra cost shows whole; neither check grows with the tensor's size.
Two runs on this 2-core machine shared with other jobs (load averages 6 and 10; medians, microseconds):
    2 ranks: plain  264 /  252   check_collectives  820 / 2003   DETAIL  3206 /  3901
    4 ranks: plain 1151 / 2213   check_collectives 7268 / 6403   DETAIL 12247 / 12581
The spread between runs is large; in each run DETAIL cost about twice what check_collectives did.
"""
import argparse
import statistics

from helpers import launch
from helpers.launcher.collective_check import timed_all_reduces


def median_us(world_size, calls, check=False, detail=False):
    """Median microseconds per all_reduce over every rank's calls."""
    per_rank = launch(timed_all_reduces, world_size, args=(calls, detail), check_collectives=check)
    return statistics.median(t for times in per_rank for t in times) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    options = parser.parse_args()
    launch(timed_all_reduces, 2, args=(1, False))  # start the forkserver: not what we compare
    print(f"median microseconds per all_reduce of one float32 ({options.calls} calls per rank, Gloo):")
    for n in options.world_sizes:
        plain = median_us(n, options.calls)
        check = median_us(n, options.calls, check=True)
        detail = median_us(n, options.calls, detail=True)
        print(f"  {n} ranks: plain {plain:7.0f}   check_collectives {check:7.0f} (+{check - plain:.0f}, "
              f"{check / plain:.1f}x)   DETAIL {detail:7.0f} (+{detail - plain:.0f}, {detail / plain:.1f}x)")


if __name__ == "__main__":
    main()
