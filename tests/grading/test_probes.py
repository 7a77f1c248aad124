"""Probes that cannot be forged: shortcuts score 0, forged properties score 0, each question has its own seed."""
import glob

import nbformat
import pytest

from helpers.grading import probes as probe_files
from helpers.grading.prepare.assemble import answer_sources, assemble, question_seed
from helpers.grading.prepare.labgen import ROOT
from helpers.grading.probes.judges import point_to_point, ring_bytes
from helpers.grading.probes.shortcuts import refusal, shortcut

LABS = sorted(p.name[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))  # every lab


def _probe(lab, question):
    return next(p for p in probe_files.load(lab)[1] if p.question == question)


# The shortcuts a second reading of the probes found (issue 12), each in the form a student would write it.
SHORTCUTS = [
    ("02", "2.4", "import torch.distributed as dist\ndef ring_all_reduce(t):\n    t = t.clone()\n"
                  "    dist.all_reduce(t)\n    return t\n", "all_reduce"),
    ("02", "2.2", "def ring_reduce_scatter(t):\n    f = getattr(dist, 'reduce_scatter_tensor')\n",
     "reduce_scatter_tensor"),
    ("03", "3.1", "from torch.utils.data import DistributedSampler\ndef shard_indices(n, rank, world_size, **kw):\n"
                  "    return list(DistributedSampler(range(n), world_size, rank, **kw))\n", "DistributedSampler"),
    ("04", "4.1", "def assign_buckets(params, cap):\n"
                  "    return dist._compute_bucket_assignment_by_size(params, [cap])\n",
     "_compute_bucket_assignment_by_size"),
    ("06", "6.1", "from helpers import theory\ndef model_state_bytes(*a, **k):\n    return theory.zero_bytes(*a)\n",
     "helpers.theory"),
    ("10", "10.1", "from torch.nn.parallel import DistributedDataParallel as DDP\n", "DistributedDataParallel"),
    ("10", "10.3", "def bring_flat_shard():\n    from torch.distributed.fsdp import fully_shard\n", "fully_shard"),
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


def test_forged_values_of_lab_10_score_zero():
    # The attack that once scored 5/5 on the old 10.3: _evaluate patched to return the booleans the old probe
    # computed in the kernel. Every lab 10 probe now judges every rank's raw run (the public checks run on it, the
    # solution's run in PyTorch's place) and compares it with the solution's run for the same seed.
    forged = {"steps": 20, "identical": True, "different_data": True, "loss_fell": True, "matches_ddp": True}
    tensor = {"__tensor__": "float32", "shape": [2], "data": [0.5, -0.25]}
    rank = {"losses": [4.0, 3.9], "params": tensor, "grads": tensor, "batches": "a", "state": {"params": 8},
            "comm": [{"all_reduce": {"calls": 1, "payload_bytes": 8, "wire_bytes": 10}}], "layout": {"buckets": 1}}
    solution = [{**rank, "batches": b} for b in "abc"]
    for probe in probe_files.load("10")[1]:
        assert not probe.grade(solution, forged, seed=5)[0], probe.name
    split = [*solution[:2], {**solution[2], "params": {**tensor, "data": [0.5, 0.0]}}]
    passed, message = probe_files.load("10")[1][0].grade(solution, split, seed=5)
    assert not passed and "rank 2's parameters differ from rank 0's" in message, message


def test_each_question_has_its_own_secret_seed():
    seeds = {question_seed(42, q) for q in ("3.1", "3.2", "3.3", "10.1")}
    assert len(seeds) == 4 and question_seed(42, "3.1") == question_seed(42, "3.1") != question_seed(43, "3.1")


@pytest.mark.parametrize("lab", LABS)
def test_no_solution_is_refused(lab):
    # Neither the library call its question rebuilds nor, on any question, a HIDING name: no honest answer (the
    # solution's) may trip them.
    setup, probes = probe_files.load(lab)
    released = nbformat.read(glob.glob(str(ROOT / "labs" / f"{lab}_*.ipynb"))[0], as_version=4)
    solution = nbformat.read(glob.glob(str(ROOT / "solutions" / f"{lab}_*.ipynb"))[0], as_version=4)
    sources = answer_sources(assemble(released, solution, setup, probes, 0)[0])
    assert not {p.question: refusal(sources[p.question], p.forbidden) for p in probes
                if refusal(sources[p.question], p.forbidden)}


@pytest.mark.parametrize("source, name", [
    ("def f(t):\n    return eval('dist.all_reduce')(t)\n", "eval"),
    ("def f(t):\n    exec(open('x').read())\n", "exec"),
    ("import importlib\ndef f(t):\n    return importlib.import_module('torch.distributed')\n", "importlib"),
    ("def f(t):\n    return __import__('torch').distributed\n", "__import__"),
    ("import helpers.grading.run.probe_runtime as rt\nrt._evaluate = lambda e, n: {'value': 1}\n", "helpers.grading"),
    ("probe_runtime._evaluate = lambda e, n: {'value': 1}\n", "probe_runtime"),
    ("def f():\n    return _PROBE_SEED\n", "_PROBE_SEED"),
    ("def f():\n    return _probe_mine(3)\n", "_probe_*"),
])
def test_code_that_hides_what_it_runs_scores_zero(source, name):
    why = refusal(source, ())
    assert why.startswith(f"uses `{name}`, which hides what the answer runs"), why


def test_method_names_that_look_like_builtins_are_not_refused():
    source = "def f(model, x):\n    model.eval()\n    step = torch.compile(model)\n    return step(x)\n"
    assert refusal(source, ()) == ""


def _ring(world_size, numel, chunked=True, op="send"):
    """Ledger rows per rank of a ring all-reduce of numel float32 elements: 2(N-1) sends of S/N, or of S."""
    size = 4 * (numel // world_size if chunked else numel)
    return [{"ledger": [[op, size]] * (2 * (world_size - 1)) + [["recv", size]] * (2 * (world_size - 1))}
            for _ in range(world_size)]


def test_an_unchunked_ring_fails_the_bytes_rule():
    rule = ring_bytes("all-reduce")
    assert rule(_ring(4, 1200), _ring(4, 1200)) == ""
    why = rule(_ring(4, 1200), _ring(4, 1200, chunked=False))
    assert why.startswith("rank 0 sent 4.00 times a ring all-reduce's bytes per rank"), why


def test_a_ring_on_library_collectives_fails_the_point_to_point_rule():
    why = point_to_point("ring_all_reduce")(None, _ring(3, 30, op="all_reduce"))
    assert why.startswith("rank 0 issued all_reduce; build ring_all_reduce from point-to-point messages"), why


# Attacks of a second red-team pass (each scored before its fix: see the commit that added it).
def test_a_dict_spelled_like_a_tensor_must_fill_its_shape():
    # {"__tensor__", "shape", "data": []} passed every tensor probe (zip compared nothing): 4/4 on lab 97.
    expected = {"__tensor__": "float32", "shape": [2], "data": [1.0, 2.0]}
    probe = probe_files.Probe("9.9", "x", "x")
    for forged in ({**expected, "data": []}, {**expected, "data": [1.0]}, {**expected, "data": [[1.0], [2.0]]},
                   {**expected, "shape": None}, {**expected, "data": "12"}):
        assert probe.grade(expected, forged)[0] is False, forged
    assert probe.grade(expected, expected) == (True, "")


def test_a_value_that_breaks_the_comparison_fails_its_probe_without_crashing_the_grader():
    # data [[0]] made float() raise in the grader: the student's grading process died (grader_error).
    probe = probe_files.Probe("9.9", "x", "x")
    expected = {"__tensor__": "float32", "shape": [1], "data": [1.0]}
    assert probe.grade(expected, {**expected, "data": [[0]]})[0] is False


@pytest.mark.parametrize("source, why", [
    ("_where = %pwd\ndef add(a, b):\n    return eval('a + b')\n", "uses IPython syntax in `_where = %pwd`"),
    ("def f(t):\n    return f?\n", "uses IPython syntax"),
    ("import torch.distributed as dist\ndef f(t):\n    return getattr(dist, 'all_' + 'reduce')(t)\n",
     "uses `getattr` to reach an attribute by a name computed at run time"),
    ("import torch.distributed as dist\ndef f(t):\n    return dist.__dict__['all_' + 'reduce'](t)\n",
     "uses `__dict__` to reach an attribute"),
    ("quit._ip.input_transformers_post.append(lambda lines: lines)\n", "uses `_ip`"),
    ("def f():\n    return In[-1]\n", "uses `In`"),
    ("import sys\ndef f():\n    return sys._getframe(1).f_locals['nonce']\n", "uses `_getframe`"),
    # The red team's routes past the scan, each as a student wrote it.
    # The course's own public checks wrap the library (lab 03's common module is DistributedSampler).
    ("from helpers.grading.checks.lab03.common import _sampler_indices\n"
     "def shard_indices(*a, **k):\n    return _sampler_indices(*a, **k)\n", "uses `helpers.grading`"),
    ("from helpers import grading\n", "uses `helpers.grading`"),
    # A library module under a name of the answer's choosing, then a name computed on it.
    ("import torch.nn.parallel as P\nDDP = P.__dict__['Distributed' + 'Data' + 'Parallel']\n", "uses `__dict__`"),
    ("from torch.utils import data as D\nS = getattr(D, 'Distributed' + 'Sampler')\n", "uses `getattr`"),
    ("import torch\nm = torch.utils.data\nS = m.__dict__['Distributed' + 'Sampler']\n", "uses `__dict__`"),
    # A module the answer writes at run time, then imports (a8), or a classmate's answers put on sys.path (a5).
    ("_name = 'Distributed' + 'Sampler'\nopen('shortcut_31.py', 'w').write(f'from torch.utils.data import {_name}')\n"
     "from shortcut_31 import shard_indices\n", "imports `shortcut_31`, which is not a module"),
    ("import sys\nsys.path.insert(0, '/tmp')\nfrom classmate import average_gradients\n", "uses `sys.path`"),
    ("def f():\n    import classmate\n    return classmate.f()\n", "imports `classmate`, which is not a module"),
    ("import runpy\nns = runpy.run_path('/tmp/x.py')\n", "uses `runpy`"),
])
def test_ipython_syntax_computed_names_the_shell_and_run_time_modules_score_zero(source, why):
    assert refusal(source, ()).startswith(why), refusal(source, ())


def test_the_scan_reads_what_python_runs():
    # The line-dropping scan once read `x = """` + `"""` here, and missed the import that runs.
    source = 'x = """\n%"""; from torch.utils.data import DistributedSampler as S; y = """\n"""\n'
    assert shortcut(source, ("DistributedSampler",)) == "DistributedSampler"
    honest = "%%ranks 2\nimport torch\nif 'weight' in model.__dict__:\n    w = getattr(model, 'weight')\n"
    assert refusal(honest, ()) == ""


def _graded_lab03():
    """Lab 03's released notebook assembled for grading, and its answer cells (to edit as a student would)."""
    setup, probes = probe_files.load("03")
    released = nbformat.read(glob.glob(str(ROOT / "labs" / "03_*.ipynb"))[0], as_version=4)
    graded = assemble(released, released, setup, probes, 0)[0]
    return graded, [c for c in graded.cells if c.metadata.get("dp_course_kind") == "answer"]


def test_a_shortcut_in_an_earlier_answer_cell_counts():
    # The alias made in 3.1's cell, called from 3.2's: 3.2's own cell names no DistributedDataParallel.
    graded, answers = _graded_lab03()
    answers[0].source += "\nfrom torch.nn.parallel import DistributedDataParallel as _wrap\n"
    answers[1].source = "def broadcast_parameters(model, src=0):\n    return _wrap(model)\n"
    why = refusal(answer_sources(graded)["3.2"], _probe("03", "3.2").forbidden)
    assert why.startswith("uses `DistributedDataParallel`"), why


def test_a_syntax_error_in_an_earlier_answer_cell_hides_no_later_one():
    # A broken 3.1 cell (the kernel runs none of it) made the joined source unparsable, and the scan then read
    # nothing at all: a later cell's eval("dist.all_reduce") passed unrefused. A later cell starting with %%ranks
    # (a cell magic IPython runs as Python) must stay readable too.
    graded, answers = _graded_lab03()
    answers[0].source = "def shard_indices(:\n"
    answers[1].source = "%%ranks 2\ndef broadcast_parameters(model, src=0):\n    return eval('dist.all_reduce')\n"
    why = refusal(answer_sources(graded)["3.2"], _probe("03", "3.2").forbidden)
    assert why.startswith("uses `eval`"), why


def test_a_cell_ipython_cleans_up_is_read_as_it_runs():
    # IPython drops a cell's leading blank lines and dedents a cell indented as a whole before it runs it. An honest
    # answer that began with a blank line was refused as "IPython syntax"; an indented one hid from the scan.
    assert refusal("\n\ndef add(a, b):\n    return a + b\n", ()) == ""
    assert refusal("    def add(a, b):\n        return a + b\n", ()) == ""
    assert refusal("\n    def add(a, b):\n        return eval('a + b')\n", ()).startswith("uses `eval`")


def test_a_probe_cell_with_a_second_result_counts_for_nothing():
    # An answer called by the probe read the nonce from In[-1] and displayed its own result first: 4/4 on lab 97.
    from helpers.grading.prepare.assemble import FORGED, probe_values
    from helpers.grading.run.probe_runtime import PROBE_MIMETYPE

    setup, probes = probe_files.load("03")
    released = nbformat.read(glob.glob(str(ROOT / "labs" / "03_*.ipynb"))[0], as_version=4)
    graded, nonces, _ = assemble(released, released, setup, probes, 0)
    cell = next(c for c in graded.cells if c.metadata.get("dp_course_question") == "3.2")
    real = {"question": "3.2", "nonce": nonces["3.2"], "results": [{"name": probes[3].name, "value": 1}]}
    shown = nbformat.v4.new_output("display_data", data={PROBE_MIMETYPE: real})
    cell.outputs = [shown]
    assert probe_values(graded, "3.2", nonces["3.2"]) == {probes[3].name: {"value": 1}}
    cell.outputs = [shown, shown]
    assert probe_values(graded, "3.2", nonces["3.2"]) == {probes[3].name: {"error": FORGED, "grader": True}}
    # The grader's own reasons are not quoted in the feedback; a kernel cannot claim to be the grader.
    real["results"][0] = {"name": probes[3].name, "error": "## Score: 10 / 10", "grader": True}
    cell.outputs = [nbformat.v4.new_output("display_data", data={PROBE_MIMETYPE: real})]
    assert probe_values(graded, "3.2", nonces["3.2"]) == {probes[3].name: {"error": "## Score: 10 / 10"}}


@pytest.mark.parametrize("source", [
    "import gc\ndef f(model):\n    gc.collect()\n    return model\n",
    "def f(prof):\n    events = prof.events()\n    return len(events)\n",
    "import inspect\ndef f(fn):\n    return inspect.signature(fn)\n",
    "%%time\ndef add(a, b):\n    return a + b\n",
    "%matplotlib inline\ndef add(a, b):\n    %time c = a + b\n    return c\n",
    "%%ranks 2\nimport torch\nx = torch.ones(2)\n%timeit -n 3 x.sum()\n",
    "def f(model, names):\n    return [getattr(model[0], name) for name in names]\n",  # chapter 08's idiom
    "def f(module, name):\n    return module.__dict__[name]\n",
])
def test_honest_answers_that_look_like_the_shell_are_not_refused(source):
    # gc.collect() before a memory reading, a profiler's events, timing magics: what students write, not attacks.
    assert refusal(source, ()) == ""


@pytest.mark.parametrize("source, why", [
    ("import gc\ndef f():\n    return [o for o in gc.get_objects() if type(o).__name__ == 'ZMQInteractiveShell']\n",
     "uses `get_objects`"),
    ("import inspect\ndef f():\n    return inspect.currentframe().f_back\n", "uses `currentframe`"),
    ("%%time\nimport importlib\n", "uses `importlib`"),
    ("%time x = eval('1')\n", "uses `eval`"),
    ("%load_ext autoreload\ndef add(a, b):\n    return a + b\n", "uses IPython syntax in `%load_ext autoreload`"),
    ("def f(t, op):\n    return getattr(torch.distributed, op)(t)\n", "uses `getattr`"),
    ("def f(t):\n    g = getattr\n    return g(dist, 'all_' + 'reduce')(t)\n", "uses `getattr`"),
])
def test_what_the_allowed_magics_run_is_read(source, why):
    assert refusal(source, ()).startswith(why), refusal(source, ())


def test_an_answer_that_replaced_display_or_the_launcher_changes_no_probe(monkeypatch, capsys):
    # Two red-team submissions scored this way: an answer cell replaced IPython.display.display (the fake rewrote
    # the probe's values and kept its nonce) or helpers.grading.shared_run.launch_gloo (the probe's SETUP imports
    # it after the answers ran). run_probes puts back what the kernel had before any student cell ran.
    import types

    import IPython
    import IPython.display

    from helpers.grading import shared_run
    from helpers.grading.run import probe_runtime

    def forged(*args, **kwargs):
        print("FORGED")
        return [1.0, 1.0]

    monkeypatch.setattr(IPython.display, "display", forged)
    monkeypatch.setattr(shared_run, "launch_gloo", forged)
    namespace = {}
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(user_ns=namespace))
    setup = "from helpers.grading.shared_run import launch_gloo as _probe_launch\n"
    probe_runtime.run_probes("1.1", setup, [("launcher", "_probe_launch.__module__ + '.' + _probe_launch.__name__")],
                             "nonce", 1)
    shown = capsys.readouterr().out
    assert "FORGED" not in shown and "helpers.grading.shared_run.launch_gloo" in shown, shown
def test_honest_imports_and_names_on_own_objects_stay_allowed():
    source = ("import math\nimport torch.nn as nn\nfrom torch.utils.data import Dataset\nimport numpy as np\n"
              "layer = nn.Linear(2, 2)\nw = getattr(layer, 'weight' if math.pi else 'bias')\n"
              "names = [n for n in layer.__dict__]\n")
    assert refusal(source, ()) == ""


# Source the parser cannot hold (red team a3b: MemoryError killed the student's grading process).
UNREADABLE = ["x = " + "-" * 100000 + "1\n", "x = 1" + "+1" * 200000 + "\n"]


@pytest.mark.parametrize("source", UNREADABLE, ids=["deep-unary", "long-sum"])
def test_an_answer_the_parser_cannot_read_scores_zero_with_a_reason(source):
    from helpers.grading.prepare.scope import outside_names
    from helpers.grading.run.grade_student import score

    assert refusal(source, ()).startswith("an answer cell run before this probe could not be read")
    probe = _probe("03", "3.1")
    marks = score([probe], {"3.1": {probe.name: {"value": 1}}}, {"3.1": {probe.name: {"value": 1}}},
                  {"3.1": source}, 0)
    assert marks["3.1"][0]["earned"] == 0 and "could not be read" in marks["3.1"][0]["message"]
    lab = nbformat.read(glob.glob(str(ROOT / "labs" / "03_*.ipynb"))[0], as_version=4)
    sub = nbformat.from_dict(lab)
    sub.cells.append(nbformat.v4.new_code_cell(source))
    assert outside_names(lab, sub) == {}


@pytest.mark.parametrize("source, what", [
    # The routes a probe's values took through the kernel (issue 29): display, its publisher, the session's packing.
    ("import IPython.core.display_functions as shown\nshown.publish_display_data = print\n",
     "shown.publish_display_data"),
    ("import json\njson.dumps = lambda *a, **k: '{}'\n", "json.dumps"),
    ("from jupyter_client.session import Session\nSession.send = print\n", "Session.send"),
    ("import torch\ntorch.allclose = lambda *a, **k: True\n", "torch.allclose"),
    ("import torch.distributed as dist\nsetattr(dist, 'all_reduce', print)\n", "setattr(dist, ...)"),
    ("import torch\nt = torch.ones(1)\ntype(t).tolist = lambda self: [3.0]\n", "type(t).tolist"),
    ("import torch\nT = torch.Tensor\ndel T.tolist\n", "T.tolist"),
    ("import json\n(lambda: json)().dumps = print\n", "(lambda: json)().dumps"),
])
def test_an_answer_that_replaces_a_library_function_scores_zero(source, what):
    why = refusal(source, ())
    assert why.startswith(f"assigns `{what}`, an attribute of a library the probes run after your answers"), why


def test_stores_on_the_answers_own_objects_stay_allowed():
    source = ("import torch\nimport torch.nn as nn\nclass Bucket:\n    def __init__(self):\n        self.grads = []\n"
              "        super().__setattr__('ready', False)\nmodel = nn.Linear(2, 2)\nmodel.weight = nn.Parameter("
              "torch.ones(2, 2))\nsetattr(model, 'bias', None)\nimport os\nos.environ['X'] = '1'\n")
    assert refusal(source, ()) == ""
    assert refusal("from unittest import mock\n", ()).startswith("uses `unittest.mock`")
