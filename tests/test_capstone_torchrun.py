"""chapters/capstone/train_gpt.py runs unchanged under torchrun: 2 processes, Gloo on the CPU, all four strategies."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = ROOT / "chapters" / "capstone" / "train_gpt.py"
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TINY = ["--steps", "10", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--batch-size", "4", "--lr", "1e-2", "--log-every", "10"]
STRATEGIES = ("manual_ddp", "manual_fsdp", "ddp", "fsdp2")
LINE = re.compile(r"^rank (\d): (\w+) loss ([\d.]+) -> ([\d.]+) parameters sha256 ([0-9a-f]{16})$", re.M)


@pytest.fixture(scope="module")
def run():
    """One torchrun of the script with a tiny model: (return code, output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [TORCHRUN, "--standalone", "--nproc-per-node=2", str(SCRIPT), *TINY, "--strategy", "all"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_exits_zero_and_reports_every_strategy_on_both_ranks(run):
    code, output = run
    assert code == 0, output[-3000:]
    found = {(int(rank), strategy) for rank, strategy, *_ in LINE.findall(output)}
    assert found == {(rank, s) for rank in (0, 1) for s in STRATEGIES}, output[-3000:]
    assert "|####################|" in output, "rank 0 prints a progress line"
    assert "tokens/s" in output and "sent B/step" in output, "rank 0 prints the summary table"


@pytest.mark.timeout(300)
def test_loss_decreases_and_parameters_are_identical_on_both_ranks(run):
    _, output = run
    by_strategy = {}
    for rank, strategy, first, last, sha in LINE.findall(output):
        assert float(last) < float(first) - 0.3, f"{strategy} rank {rank}: loss {first} -> {last} did not decrease"
        by_strategy.setdefault(strategy, set()).add(sha)
    for strategy, shas in by_strategy.items():
        assert len(shas) == 1, f"{strategy}: final parameters differ between the ranks: {shas}"


@pytest.mark.timeout(300)
def test_the_four_implementations_agree(run):
    _, output = run
    last = {strategy: float(loss) for rank, strategy, _, loss, _ in LINE.findall(output) if rank == "0"}
    assert abs(last["manual_ddp"] - last["ddp"]) < 1e-4, last      # same sums, same order: equal
    assert max(last.values()) - min(last.values()) < 1e-3, last      # FSDP: the norm is summed in another order
