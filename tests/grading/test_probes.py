"""Probes that cannot be forged: shortcuts score 0, forged properties score 0, each question has its own seed."""
import glob

import nbformat
import pytest

from helpers.grading import probes as probe_files
from helpers.grading.assemble import answer_sources, assemble, question_seed
from helpers.grading.labgen import ROOT
from helpers.grading.shortcuts import shortcut

LABS = [f"{n:02d}" for n in range(1, 11)]


def _probe(lab, question):
    return next(p for p in probe_files.load(lab)[1] if p.question == question)


@pytest.mark.parametrize("lab", LABS)
def test_no_solution_uses_what_its_question_forbids(lab):
    setup, probes = probe_files.load(lab)
    released = nbformat.read(glob.glob(str(ROOT / "labs" / f"{lab}_*.ipynb"))[0], as_version=4)
    solution = nbformat.read(glob.glob(str(ROOT / "solutions" / f"{lab}_*.ipynb"))[0], as_version=4)
    sources = answer_sources(assemble(released, solution, setup, probes, 0)[0])
    assert not [(p.question, shortcut(sources[p.question], p.forbidden)) for p in probes
                if shortcut(sources[p.question], p.forbidden)]


# The shortcuts a second reading of the probes found (issue 12), each in the form a student would write it.
SHORTCUTS = [
    ("02", "2.4", "import torch.distributed as dist\ndef ring_all_reduce(t):\n    t = t.clone()\n"
                  "    dist.all_reduce(t)\n    return t\n", "all_reduce"),
    ("02", "2.2", "def ring_reduce_scatter(t):\n    f = getattr(dist, 'reduce_scatter_tensor')\n", "reduce_scatter_tensor"),
    ("03", "3.1", "from torch.utils.data import DistributedSampler\ndef shard_indices(n, rank, world_size, **kw):\n"
                  "    return list(DistributedSampler(range(n), world_size, rank, **kw))\n", "DistributedSampler"),
    ("04", "4.1", "def assign_buckets(params, cap):\n    return dist._compute_bucket_assignment_by_size(params, [cap])\n",
     "_compute_bucket_assignment_by_size"),
    ("06", "6.1", "from helpers import theory\ndef model_state_bytes(*a, **k):\n    return theory.zero_bytes(*a)\n",
     "helpers.theory"),
    ("10", "10.3", "from torch.nn.parallel import DistributedDataParallel as DDP\n", "DistributedDataParallel"),
]


@pytest.mark.parametrize("lab, question, source, name", SHORTCUTS, ids=[s[1] for s in SHORTCUTS])
def test_a_shortcut_scores_zero_even_with_the_right_value(lab, question, source, name):
    probe = _probe(lab, question)
    right = {"__tensor__": "float32", "shape": [1], "data": [1.0]}
    assert probe.judge or probe.grade(right, right)[0], "the same value passes without the shortcut"
    passed, message = probe.grade(right, right, answer_source=source)
    assert not passed and message == f"uses `{name}`, which this question asks you to build yourself: 0 points"


def test_a_comment_or_docstring_is_not_a_shortcut():
    source = 'def ring_all_reduce(t):\n    """Unlike dist.all_reduce, ..."""\n    # not all_reduce\n    return t\n'
    assert shortcut(source, ("all_reduce",)) is None


def test_forged_properties_of_10_3_score_zero():
    # The attack that scored 5/5: _evaluate patched to return the booleans the old probe computed in the kernel.
    forged = {"steps": 20, "identical": True, "different_data": True, "loss_fell": True, "matches_ddp": True}
    for probe in (p for p in probe_files.load("10")[1] if p.question == "10.3"):
        passed, message = probe.grade(forged, forged, seed=5)
        assert not passed and "did not return" in message


def test_forged_batches_of_10_1_score_zero():
    probe = _probe("10", "10.1")
    forged = {"shapes": [[2, 6]] * 10, "windows": True, "in_range": True, "distinct": True}
    assert not probe.grade(forged, forged, seed=5)[0]


def test_each_question_has_its_own_secret_seed():
    seeds = {question_seed(42, q) for q in ("3.1", "3.2", "3.3", "10.1")}
    assert len(seeds) == 4 and question_seed(42, "3.1") == question_seed(42, "3.1") != question_seed(43, "3.1")
