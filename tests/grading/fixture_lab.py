"""A two-question lab (number 97) built in a temporary directory, with its probes and submissions."""
import pathlib

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.grading.prepare.labgen import student_notebook

ADD = '''import torch

def add(a, b):
    """Elementwise sum of two tensors."""
    ### BEGIN SOLUTION (lab 97.1) return the sum
    return a + b
    ### END SOLUTION
'''

RANK_SUM = '''import torch
import torch.distributed as dist
from helpers import launch

def rank_sum(world_size):
    """Sum of the ranks 0..world_size-1, computed with an all_reduce on world_size ranks."""
    ### BEGIN SOLUTION (lab 97.2) all_reduce each rank's id
    def one_rank():
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t.item()
    return launch(one_rank, world_size, hang_timeout=5)[0]
    ### END SOLUTION
'''

# 97.2 answered with all_gather (tests/grading/test_similarity.py): the original ...
GATHER_SUM = '''import torch
import torch.distributed as dist
from helpers import launch

def rank_sum(world_size):
    """Sum of the ranks 0..world_size-1, computed with an all_reduce on world_size ranks."""
    def gather_ranks():
        mine = torch.full((1,), float(dist.get_rank()))
        everyone = [torch.zeros(1) for _ in range(dist.get_world_size())]  # one slot per rank
        dist.all_gather(everyone, mine)
        return float(torch.cat(everyone).sum())
    return launch(gather_ranks, world_size, hang_timeout=5)[0]
'''

# ... and its copy: names changed, comments moved and reworded, two statements swapped, lines broken and joined,
# quotes and spacing changed.
GATHER_SUM_COPIED = """import torch
import torch.distributed as dist
from helpers import launch

def rank_sum(world_size):
    '''Sum of the ranks 0..world_size-1, computed with an all_reduce on world_size ranks.'''
    # every rank sends its id to all the others
    def collect():
        # a buffer per rank
        parts = [torch.zeros(1)
                 for i in range(dist.get_world_size())]

        t=torch.full( (1, ), float( dist.get_rank() ) )
        dist.all_gather(parts, t); return float(torch.cat(parts).sum())
    return launch(collect, world_size,
                  hang_timeout=5)[0]
"""

PROBES = '''from helpers.grading.probes import Probe

SETUP = "import torch as _probe_torch"
PROBES = [
    Probe("97.1", "adds two vectors", "add(_probe_torch.arange(4.0), _probe_torch.ones(4))"),
    Probe("97.1", "adds integers", "add(_probe_torch.tensor([2, 3]), _probe_torch.tensor([5, 7]))"),
    Probe("97.2", "three ranks", "rank_sum(3)", points=2),
]
'''


def build(root):
    """Write labs/, solutions/ and probes/ for lab 97 under root; return the solution notebook."""
    root = pathlib.Path(root)
    solution = new_notebook(cells=[
        new_markdown_cell("# Lab 97: a fixture"),
        new_code_cell("%load_ext helpers\nfrom helpers.grading import check"),
        new_code_cell(ADD),
        new_code_cell('check("97.1", globals())'),
        new_code_cell(RANK_SUM),
        new_code_cell('check("97.2", globals())'),
    ])
    solution.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for sub in ("labs", "solutions", "probes", "submissions"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    nbformat.write(solution, root / "solutions" / "97_fixture.ipynb")
    nbformat.write(student_notebook(solution), root / "labs" / "97_fixture.ipynb")
    (root / "probes" / "lab97.py").write_text(PROBES)
    return solution


def submission(root, student, add_source=None, rank_sum_source=None, edit=None):
    """A student's notebook: the released lab with the answer cells replaced (and other edits)."""
    root = pathlib.Path(root)
    nb = nbformat.read(root / "labs" / "97_fixture.ipynb", as_version=4)
    if add_source is not None:
        nb.cells[2].source = add_source
    if rank_sum_source is not None:
        nb.cells[4].source = rank_sum_source
    if edit:
        edit(nb)
    path = root / "submissions" / f"{student}.ipynb"
    nbformat.write(nb, path)
    return path
