"""`make bench`: lab 04's bucketed, overlapped Reducer against torch DDP and a per-parameter all-reduce.

    python -m tests.bench_bucketing [--world-size 2] [--layers 80] [--bucket-cap-mb 0.0625] [--repeats 30]

The Reducer is the solution's own code, taken from solutions/04_bucketing_and_overlap.ipynb (its imports,
functions and classes are executed, as the lab's tests do), so the benchmark always measures what the lab
teaches. The model has many small parameters (LAYERS blocks of Linear(32, 32) + Tanh: 2 x LAYERS tensors).
One training step = zero_grad, forward, backward, gradient averaging, SGD step. The three variants run
interleaved on the same ranks, each step after a barrier; a step's time is its slowest rank's, and the
medians over steps are compared. Targets (issue): Reducer <= 1.15 x torch DDP, per-parameter >= 2 x Reducer.
With --strict the exit code is 1 when a target is missed (timings on a shared machine are noisy).
"""
import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers import launch
from tests.test_lab04_checks import solution_namespace

TARGET_VS_DDP = 1.15  # Reducer step time / torch DDP step time, at most
TARGET_PER_PARAMETER = 2.0  # per-parameter step time / Reducer step time, at least


def make_model(layers, width, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())])


def per_parameter(model):
    """Chapter 03's average_gradients: after backward, one blocking all-reduce per gradient tensor."""
    world_size = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size


def bench_rank(reducer_class, layers, width, batch, bucket_cap_mb, warmup, repeats):
    """On every rank: time the three variants' steps, interleaved; return step times and final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    generator = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(batch, width, generator=generator), torch.randn(batch, width, generator=generator)
    ours = make_model(layers, width)
    reducer = reducer_class(ours, bucket_cap_mb)
    variants = {
        "per-parameter all-reduce": (make_model(layers, width), None),
        "lab 04 Reducer": (ours, reducer.finalize),
        "torch DDP": (DDP(make_model(layers, width), bucket_cap_mb=bucket_cap_mb), lambda: None),
    }
    per_param_model = variants["per-parameter all-reduce"][0]
    variants["per-parameter all-reduce"] = (per_param_model, lambda: per_parameter(per_param_model))
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, (model, _) in variants.items()}
    times = {name: [] for name in variants}
    for step in range(warmup + repeats):
        for name, (model, sync) in variants.items():
            dist.barrier()
            start = time.perf_counter()
            optimizers[name].zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            sync()
            optimizers[name].step()
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    params = {name: torch.cat([p.detach().reshape(-1) for p in model.parameters()])
              for name, (model, _) in variants.items()}
    return times, params, len(reducer.buckets)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--bucket-cap-mb", type=float, default=64 / 1024, help="default: 64 KiB, several buckets")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    options = parser.parse_args()
    reducer_class = solution_namespace()["Reducer"]
    results = launch(bench_rank, options.world_size, backend="gloo", hang_timeout=120, args=(
        reducer_class, options.layers, options.width, options.batch, options.bucket_cap_mb,
        options.warmup, options.repeats))
    n_tensors = 2 * options.layers
    n_bytes = 4 * options.layers * (options.width + 1) * options.width
    print(f"{options.world_size} Gloo ranks, {options.layers} x Linear({options.width}, {options.width}): {n_tensors} "
          f"parameter tensors, {n_bytes:,} bytes; bucket_cap_mb = {options.bucket_cap_mb:g} "
          f"({results[0][2]} buckets in the Reducer); median of {options.repeats} steps (slowest rank per step):")
    medians = {}
    for name in results[0][0]:
        per_step = [max(ranks) for ranks in zip(*(times[name] for times, _, _ in results))]
        medians[name] = statistics.median(per_step)
        print(f"  {name:26s} {medians[name] * 1e3:8.2f} ms   (min {min(per_step) * 1e3:.2f} ms)")
    ours, ddp, per_param = (medians[k] for k in ("lab 04 Reducer", "torch DDP", "per-parameter all-reduce"))
    error = (results[0][1]["lab 04 Reducer"] - results[0][1]["torch DDP"]).abs().max().item()
    print(f"  max |Reducer params - DDP params| after {options.warmup + options.repeats} steps: {error:.1e}")
    verdicts = [("Reducer / torch DDP", ours / ddp, ours / ddp <= TARGET_VS_DDP, f"target <= {TARGET_VS_DDP}x"),
                ("per-parameter / Reducer", per_param / ours, per_param / ours >= TARGET_PER_PARAMETER,
                 f"target >= {TARGET_PER_PARAMETER}x")]
    for label, ratio, ok, target in verdicts:
        print(f"{label:24s} = {ratio:5.2f}x  ({target}) {'ok' if ok else 'MISSED'}")
    if options.strict and not all(ok for *_, ok, _ in verdicts):
        sys.exit(1)


if __name__ == "__main__":
    main()
