"""Executing notebooks in a fenced kernel: timeouts interrupt, and the launcher survives them."""
import tempfile

import nbformat
import pytest

from helpers.grading.run.execute import Limits, execute

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tmp_path():
    """A short working directory: the kernel's unix sockets live in it (pytest's tmp_path can be too long)."""
    with tempfile.TemporaryDirectory(prefix="exec-") as path:
        yield path


def errors(nb):
    """The error outputs of every cell, to show when a status is not the expected one."""
    return [(o.get("ename"), o.get("evalue")) for c in nb.cells for o in c.get("outputs", [])
            if o.get("output_type") == "error"]


def limits(cell_seconds, total_seconds):
    """No torch._dynamo in the forkserver, as the grader decides for a lab whose ranks do not need it
    (grade.ranks_need_dynamo): these cells need none, and importing it cost each kernel 2.8 CPU-s."""
    return Limits(cell_seconds=cell_seconds, total_seconds=total_seconds, preload_dynamo=False)


def notebook(*sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


FILLS_RUNTIME = ("import os\nfor i in range(100):\n"
                 "    open(os.path.join(os.environ['JUPYTER_RUNTIME_DIR'], str(i)), 'w')")


# What a submission could copy from the grader's environment into a failure message (its feedback goes back to the
# student): jupyter_client starts a kernel with the grader's whole environment plus the kernelspec's, so the
# graded kernel saw every variable of the instructor's shell (API tokens included) until the sandbox set its own.
READS_ENV = "import os\nprint(sorted(k for k in os.environ if 'SECRET' in k or k.startswith('PYTEST')))"


def test_timeout_interrupts_only_that_cell_launches_still_work_and_files_by_the_sockets_kill(tmp_path, monkeypatch):
    # The interrupt reaches the kernel's whole process group, forkserver included; it must survive (it ignores
    # SIGINT), or the next launch fails. The limit is 5 s (the forkserver starts with the kernel,
    # helpers.launcher.kernel, so no cell waits for it, and 2 ranks start in < 1 s), not 30 as when a first launch
    # started it. The loop sleeps, so it burns no core meanwhile (5 CPU-s); the interrupt stops it all the same, and
    # test_grade_fixture's infinite_loop is the spinning one.
    # The last cell piles files up where the kernel's sockets are, on the grader's disk (sandbox.runtime_overfull).
    # The first cell reads the environment: nothing of the grader's (a secret planted here) reaches the kernel.
    monkeypatch.setenv("DP_COURSE_GRADER_SECRET", "hunter2")
    nb = notebook("%load_ext helpers\n" + READS_ENV, "import time\nwhile True:\n    time.sleep(0.1)",
                  "%%ranks 2\nprint('after the loop')", FILLS_RUNTIME)
    result = execute(nb, str(tmp_path), limits(cell_seconds=5, total_seconds=120))
    assert [c["status"] for c in result.cells] == ["ok", "timeout", "ok", "error"], errors(nb)
    # PYTEST_CURRENT_TEST too: the grader's process has it while this test runs (20 variables in all were seen).
    assert nb.cells[0].outputs[0]["text"] == "[]\n", nb.cells[0].outputs
    assert result.status == "timeout" and result.kernels == 1
    assert "[rank 1] after the loop" in str(nb.cells[2].outputs)
    assert "wrote files in (or changed) the directory of its kernel's sockets, on the grader's disk" in str(
        nb.cells[3].outputs)


def test_wall_clock_limit_skips_the_rest(tmp_path):
    nb = notebook("import time\ntime.sleep(3)", "x = 1", "y = 2")
    result = execute(nb, str(tmp_path), limits(cell_seconds=10, total_seconds=2))
    assert result.status == "timeout"
    assert [c["status"] for c in result.cells][-1] == "skipped"


def test_dead_kernel_is_reported_and_no_new_kernel_starts_for_nothing(tmp_path):
    # A kernel lost in a middle cell is replaced (test_grade_fixture's ignores_sigint needs 2); in the last, not.
    nb = notebook("x = 1", "import os\nos._exit(3)")
    result = execute(nb, str(tmp_path), limits(cell_seconds=10, total_seconds=30))
    assert (result.status, result.kernels) == ("dead_kernel", 1)


def test_a_working_directory_too_long_for_unix_sockets_is_refused():
    with pytest.raises(ValueError, match="too long for the kernel's unix sockets: grade in a shorter one"):
        execute(notebook("x = 1"), "/tmp/" + "d" * 100, limits(cell_seconds=10, total_seconds=30))
