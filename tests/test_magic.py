"""%%ranks, driven without Jupyter: parsing, shipping notebook variables, collecting results."""
import pytest

from helpers import CollectiveHang, RankFailed
from helpers.launcher.magic import parse_line, ranks, report_lines

pytestmark = pytest.mark.timeout(60)


def test_parse_line_defaults_and_options():
    options = parse_line("4")
    assert (options.world_size, options.backend, options.hang_timeout, options.collect) == (4, "auto", 30.0, [])
    options = parse_line("3 --backend gloo --hang-timeout 5 --collect a,b")
    assert (options.world_size, options.backend, options.hang_timeout, options.collect) == (3, "gloo", 5.0, ["a", "b"])


@pytest.mark.parametrize("line, match", [("", "Usage: %%ranks 4"), ("four", "Usage"),
                                         ("2 --backend mpi", "Usage"), ("2 --bogus", "unknown option")])
def test_parse_line_errors_show_usage(line, match):
    with pytest.raises(ValueError, match=match):
        parse_line(line)


CELL = """
import torch, torch.distributed as dist
t = torch.tensor([scale * (dist.get_rank() + 1.0)])
dist.all_reduce(t)
total = double(t.item())
print("total", total)
dist.get_rank()
"""


def test_cell_sees_notebook_variables_and_collects(capsys):
    user_ns = {"scale": 10.0, "double": lambda x: 2 * x}
    ranks("2 --collect total", CELL, user_ns)
    assert user_ns["total"] == [60.0, 60.0]
    out = capsys.readouterr().out
    assert "[rank 1] total 60.0" in out
    assert "[rank 1] 1" in out  # the last expression is echoed, like a notebook cell


def test_error_in_cell_shows_cell_source():
    with pytest.raises(RankFailed) as info:
        ranks("2", "import torch.distributed as dist\nx = 1\nif dist.get_rank() == 1:\n    1 / 0\n", {})
    assert "rank 1 raised ZeroDivisionError" in str(info.value)
    assert "<ranks cell" in str(info.value) and "1 / 0" in str(info.value)


def test_locations_count_the_ranks_line_and_name_the_cell():
    # On screen the cell is "%%ranks 2" then the code: `1 / 0` is on line 5 of In [7].
    with pytest.raises(RankFailed) as info:
        ranks("2", "import torch.distributed as dist\nx = 1\nif dist.get_rank() == 1:\n    1 / 0\n", {}, label="In [7]")
    assert "In [7], line 5" in str(info.value) and "1 / 0" in str(info.value), str(info.value)


def test_report_lines_are_short_and_say_how_to_get_the_traceback():
    hang = CollectiveHang("deadlock: " + "word " * 40 + "\n  rank 0: blocked in barrier #1", reports=[])
    lines = report_lines(CollectiveHang, hang)
    assert lines[0].startswith("CollectiveHang: deadlock: word")
    assert max(map(len, lines)) <= 88 and "%tb" in lines[-1], lines
    assert all(not word.startswith("ord") for line in lines for word in line.split()), "a word was cut"
    assert report_lines(KeyboardInterrupt, KeyboardInterrupt())[0].startswith("KeyboardInterrupt: interrupted")


def test_unsendable_variable_is_explained():
    import threading

    with pytest.raises(RankFailed, match="the notebook's `lock` could not be sent to the ranks"):
        ranks("1", "lock.acquire()\n", {"lock": threading.Lock()})


def test_collect_of_unassigned_name():
    with pytest.raises(RankFailed, match=r"the cell never assigned \['nope'\]"):
        ranks("1 --collect nope", "x = 1\n", {})


def test_syntax_error_raised_once_in_kernel():
    with pytest.raises(SyntaxError):
        ranks("2", "def broken(:\n", {})


def test_hang_in_cell_reports_cell_line():
    cell = "import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n"
    with pytest.raises(CollectiveHang, match=r"rank 0: blocked in barrier #1, called at <ranks cell \d+>, line 4"):
        ranks("2 --hang-timeout 2", cell, {})
