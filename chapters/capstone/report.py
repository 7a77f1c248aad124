"""Lab 10's report table: one row per training run, from its measurements, beside the formulas.

    print(strategy_table(rows, world_size=3, num_params=4496))

A row is what `capstone.yours.train` returns on one rank, plus its name and the formula it is read against:
    {"name": "yours: Reducer", "formula": "ddp", "comm": [{op: {"calls", "payload_bytes", "wire_bytes"}}, ...],
     "state": {"params", "grads", "optimizer", "total"}, "seconds": [per step]}
The columns:
    bytes sent / step   the ledger's wire bytes (helpers.comm: ring convention) of the LAST step, all ops
    formula             helpers.theory.comm_volume(formula, psi, N, bytes_per_element=4, kind="wire")
    state / rank        helpers.memory.state_bytes after the last step: params + grads + optimizer (bytes)
    formula             helpers.theory.strategy_memory(psi, N, formula, fp32 AdamW: 4 + 4 + 8 bytes per parameter)
    step (ms)           the median step time on the slowest rank, the first step left out (it pays for first calls)
    collectives / step  calls per op in the last step, e.g. "3 all_reduce"
The formulas use psi unpadded; flat shards pad psi to a multiple of N, so a sharded run measures a little more.
"""
import statistics

from helpers.theory import CONVENTIONS, comm_volume, strategy_memory

FORMULAS = ("ddp", "zero1", "zero2", "zero3")
_HEADER = ("| run | collectives / step | bytes sent / step | formula | state / rank (B) | formula | step (ms) |\n"
           "|---|---|---:|---:|---:|---:|---:|")


def formula_bytes(formula, world_size, num_params):
    """(wire bytes per step, model-state bytes per rank) that the formulas give for fp32 AdamW."""
    if formula not in FORMULAS:
        raise ValueError(f"formula={formula!r}: read a run against one of {FORMULAS} "
                         f"(a Reducer or DDP: 'ddp'; ZeRO-2: 'zero2'; FlatShard or fully_shard: 'zero3')")
    sent = comm_volume(formula, num_params, world_size, bytes_per_element=4, kind="wire")
    held = strategy_memory(num_params, world_size, formula, **CONVENTIONS["fp32_adam"])["total"]
    return sent, held


def median_step_ms(seconds):
    """The median step in milliseconds, the first step left out when there are more."""
    if not seconds:
        raise ValueError("seconds=[]: a run measures at least one step; train for steps >= 1")
    return 1e3 * statistics.median(seconds[1:] or seconds)


def strategy_row(row, world_size, num_params):
    """One Markdown table row from one run's measurements."""
    missing = {"name", "formula", "comm", "state", "seconds"} - set(row)
    if missing:
        raise ValueError(f"a row needs {sorted(missing)}: pass what capstone.yours.train returns, with 'name' "
                         f"and 'formula' added")
    last = row["comm"][-1]
    sent = sum(t["wire_bytes"] for t in last.values())
    calls = ", ".join(f"{t['calls']} {op}" for op, t in sorted(last.items())) or "none"
    sent_formula, held_formula = formula_bytes(row["formula"], world_size, num_params)
    return (f"| {row['name']} | {calls} | {sent:,} | {sent_formula:,.0f} | {row['state']['total']:,} | "
            f"{held_formula:,.0f} | {median_step_ms(row['seconds']):.1f} |")


def strategy_table(rows, world_size, num_params):
    """The report's table in Markdown: a header, then one row per run, in the order given."""
    if not rows:
        raise ValueError("rows=[]: pass one row per run (yours and PyTorch's), see the module docstring")
    lines = [_HEADER] + [strategy_row(row, world_size, num_params) for row in rows]
    return "\n".join(lines)
