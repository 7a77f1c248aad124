"""Lab 13's public checks: there are as many as the lab says, a check() cell for every question, and the torch
behaviour the lab's text and checks rely on (torch 2.13, read in its installed source).

The solution passes every check: tests/test_labs.py runs the solution notebook and asserts each check() result.
The wrong answers, with the first line each must get, are the catalogue tests/mistakes/lab13.py, run by
tests/test_mistakes.py.
"""
import inspect

import pytest

from helpers.grading.checks.lab13 import common
from helpers.grading.checks.lab13 import q2_powersgd_hook as q2
from helpers.grading.registry import checks_for

TOTALS = {"13.1": 4, "13.2": 4, "13.3": 3}


@pytest.mark.parametrize("question", sorted(TOTALS))
def test_every_question_has_its_number_of_checks(question):
    assert len(checks_for(question)) == TOTALS[question]


def test_register_comm_hook_refuses_bf16_compress_hook_by_name():
    """13.1 calls PyTorch's bf16 hook under another name: DDP refuses it by its name on a CPU build, not by what it
    does (the hook all-reduces a bf16 tensor, which Gloo does)."""
    from torch.nn.parallel import DistributedDataParallel

    source = inspect.getsource(DistributedDataParallel._check_comm_hook)
    assert "bf16_compress_hook" in source and "__name__" in source


def test_powersgd_orthogonalises_with_gram_schmidt_at_rank_2():
    """13.2's tolerance: at rank <= 2 powerSGD_hook runs Gram-Schmidt, as the lab's orthogonalize does, so the two
    differ only in the order of float32 operations (torch.bmm on groups of matrices against @ one by one)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    assert "rank <= 2" in inspect.getsource(powerSGD_hook._orthogonalize) and common.PSGD_RANK <= 2


def test_the_predicted_bytes_follow_should_compress():
    """13.2's byte formula against PyTorch's own rule, matrix by matrix."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    shapes = q2._shapes()
    for n, m in shapes:
        assert common.worth_compressing(n, m) == _should_compress(n, m, common.PSGD_RANK,
                                                                  common.MIN_COMPRESSION_RATE)[0]
    plain, (uncompressed, ps, qs) = q2.predicted_bytes()
    assert plain == 4 * common.numel() and uncompressed + ps + qs < plain / 2
