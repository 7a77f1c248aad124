"""chapters/capstone/report.py: lab 10's table, from measurements, beside the formulas; bad rows say what to pass."""
import pytest

from chapters.capstone.report import (
    formula_bytes,
    median_step_ms,
    strategy_row,
    strategy_table,
)

PSI, N = 1200, 3


def _row(name, formula, comm, total, seconds=(0.5, 0.010, 0.030, 0.020)):
    return {"name": name, "formula": formula, "comm": [{}, comm], "seconds": list(seconds),
            "state": {"params": 0, "grads": 0, "optimizer": 0, "total": total}}


def test_formulas_for_fp32_adamw_on_three_ranks():
    # wire: DDP and ZeRO-2 2 (N-1)/N x 4 psi = 6400; ZeRO-3 1.5 times that.
    # State: 16 psi, 4 psi + 12 psi / N, 16 psi / N.
    assert formula_bytes("ddp", N, PSI) == (6400, 19200)
    assert formula_bytes("zero2", N, PSI) == (6400, 9600)
    assert formula_bytes("zero3", N, PSI) == (9600, 6400)
    assert formula_bytes("zero1", N, PSI) == (6400, 4 * PSI + 4 * PSI + 8 * PSI / N)


def test_the_table_has_one_row_per_run_from_its_last_step():
    rows = [_row("your Reducer", "ddp", {"all_reduce": {"calls": 4, "payload_bytes": 4800, "wire_bytes": 6398}}, 19216),
            _row("your FlatShard", "zero3", {"all_gather": {"calls": 4, "payload_bytes": 9600, "wire_bytes": 6400},
                                             "reduce_scatter": {"calls": 2, "payload_bytes": 4800,
                                                                "wire_bytes": 3200}}, 6408)]
    lines = strategy_table(rows, N, PSI).splitlines()
    assert lines[0].startswith("| run | collectives / step | bytes sent / step | formula |") and len(lines) == 4
    assert lines[2] == "| your Reducer | 4 all_reduce | 6,398 | 6,400 | 19,216 | 19,200 | 20.0 |"
    assert lines[3] == "| your FlatShard | 4 all_gather, 2 reduce_scatter | 9,600 | 9,600 | 6,408 | 6,400 | 20.0 |"


def test_the_median_step_leaves_the_first_out():
    assert median_step_ms([9.0, 0.001, 0.003]) == pytest.approx(2.0)
    assert median_step_ms([0.004]) == pytest.approx(4.0)       # one step: that one


@pytest.mark.parametrize("call, message", [
    (lambda: formula_bytes("fsdp", N, PSI), "formula='fsdp': read a run against one of"),
    (lambda: strategy_row({"name": "x"}, N, PSI), r"a row needs \['comm', 'formula', 'seconds', 'state'\]"),
    (lambda: strategy_table([], N, PSI), r"rows=\[\]: pass one row per run"),
    (lambda: median_step_ms([]), r"seconds=\[\]: a run measures at least one step"),
])
def test_bad_input_says_what_to_pass(call, message):
    with pytest.raises(ValueError, match=message):
        call()
