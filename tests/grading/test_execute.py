"""Executing notebooks in a fenced kernel: timeouts interrupt, and the launcher survives them."""
import tempfile

import nbformat
import pytest

from helpers.grading.run.cgroup import memory_root
from helpers.grading.run.execute import Limits, execute
from helpers.grading.run.sandbox import Fences

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


# Issue 29: an answer displayed 435 MiB in the probes' own MIME type, which the cap let through (the probe cell's
# values travelled that way): a 435 MiB executed notebook. And a display update rewrites every output of its id, in
# any cell: 50 small outputs, then one update of 2,000 characters, are 100,000 characters of notebook. The cap here is
# 50,000 (the grader's is 1,000,000), so the attack is cheap.
PROBE_TYPE_OUTPUT = ("from IPython.display import display\n"
                     "display({'application/vnd.dp-course.probe+json': {'x': 'y' * 200_000}}, raw=True)")
DISPLAY_IDS = "from IPython.display import display\nfor _ in range(50):\n    display('x', display_id='d')"
DISPLAY_UPDATE = "from IPython.display import update_display\nupdate_display('y' * 2000, display_id='d')"
# The probes' values come by the grader's pipe, signed with the probe cell's nonce (run/channel.py): a line a cell
# writes on it without the nonce, or a display claiming to be a probe's result, counts for nothing.
PROBE = ("from helpers.grading.run.probe_runtime import run_probes\n"
         "run_probes('9.1', '', [('sum', '1 + 1')], 'nonce-9f2c', 1)")
FORGES_A_LINE = ("import os\nfd = int(os.environ['DP_COURSE_PROBE_FD'])\n"
                 "body = b'{\"question\": \"9.1\", \"results\": [{\"name\": \"sum\", \"value\": 3}]}'\n"
                 "os.write(fd, b'0' * 64 + b' ' + body + b'\\n')")


def test_every_output_counts_against_the_cap_and_probes_use_their_own_pipe(tmp_path):
    from helpers.grading.prepare.assemble import probe_values

    nb = notebook(PROBE_TYPE_OUTPUT, DISPLAY_IDS, DISPLAY_UPDATE, FORGES_A_LINE, PROBE)
    for cell in nb.cells[-1:]:
        cell.metadata.update(dp_course_kind="probe", dp_course_question="9.1")
    result = execute(nb, str(tmp_path), Limits(cell_seconds=20, total_seconds=60, preload_dynamo=False,
                                               output_chars=50_000))
    assert [c["status"] for c in result.cells] == ["ok"] * 5, errors(nb)
    first = str(nb.cells[0].outputs)
    assert len(first) < 1000 and "output beyond 50,000 characters dropped" in first, first
    assert "yyyy" not in str(nb.cells[1].outputs) and "output beyond 50,000" in str(nb.cells[2].outputs)
    assert nb.cells[4].outputs == [], "the probe displays nothing in the grader's kernel"
    assert len(result.records) == 2  # the forged line and the probe's
    assert probe_values(nb, "9.1", "nonce-9f2c", result.records) == {"sum": {"value": 2}}
    assert probe_values(nb, "9.1", "another nonce", result.records) == {}


@pytest.mark.skipif(memory_root() is None, reason="no writable memory cgroup here (grade as root)")
def test_a_kernel_and_its_ranks_past_their_memory_cgroup_are_stopped(tmp_path):
    # Each process has prlimit's address-space cap (Limits.memory_bytes), so 4 ranks and the kernel could hold 5 times
    # it (20 GiB at the grader's 4 GiB). Their memory cgroup holds them together: here 2 ranks of 400 MiB each under a
    # cap of 600 MiB for the kernel and its ranks. The kernel is killed and its note says why (the last cell: no new
    # kernel starts for nothing, test_dead_kernel_is_reported_and_no_new_kernel_starts_for_nothing).
    nb = notebook("%load_ext helpers", "%%ranks 2\nimport time\nhog = b'x' * (400 * 2**20)\ntime.sleep(30)")
    fences = Fences(sandbox=False, drop_user=False, memory=False, memory_cgroups=True)
    result = execute(nb, str(tmp_path), Limits(cell_seconds=30, total_seconds=90, preload_dynamo=False, fences=fences,
                                               kernel_memory_bytes=600 * 2**20))
    assert [c["status"] for c in result.cells] == ["ok", "error"], (result.cells, errors(nb))
    assert result.status == "memory_limit" and result.kernels == 1
    said = str(nb.cells[1].outputs)
    assert "its kernel and ranks together passed their memory limit, so its kernel was killed" in said, said
