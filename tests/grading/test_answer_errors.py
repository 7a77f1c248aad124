"""The student's own error first: an answer cell that failed is quoted with its line, ahead of what follows from it.

Executed notebooks are built here with the outputs a kernel gives (IPython 9's error outputs, ANSI colours and all);
the fixture class in test_grade_fixture.py checks the same on a real run (its syntax_error student)."""
import nbformat

from helpers.grading.judge.answer_errors import GRADER_CODE, failures
from helpers.grading.judge.redact import REACHES, Secrets
from helpers.grading.report.feedback import feedback_markdown

SYNTAX = {"output_type": "error", "ename": "SyntaxError", "evalue": "expected ':' (4231927158.py, line 2)",
          "traceback": ["  \x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[3]\x1b[39m\x1b[32m, line 2\x1b[39m\n"
                        "\x1b[31m    def average_gradients(model, world_size)\x1b[39m\n  ^\n"
                        "\x1b[31mSyntaxError\x1b[39m\x1b[31m:\x1b[39m expected ':'\n"]}
SOURCE_3_3 = "import torch\ndef average_gradients(model, world_size)\n    pass\n"
PROBE = ("from helpers.grading.run.probe_runtime import run_probes as _probe_run\n_probe_run('3.2', 'import torch as "
         "_probe_torch; _secret_setup_value = 1', [('sums', 'rank_sum(3)')], '9f3ac0d1e2b4a687', 1357913579)\n")


def _frame(count, line):
    return f"\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[{count}]\x1b[39m\x1b[32m, line {line}\x1b[39m\n"


def _cell(source, questions, count, outputs=(), kind="answer"):
    cell = nbformat.v4.new_code_cell(source, execution_count=count, outputs=[nbformat.from_dict(o) for o in outputs])
    cell.metadata["dp_course_kind"] = kind
    if questions:
        cell.metadata["dp_course"] = {"answers": questions}
    return cell


def _notebook(*cells):
    return nbformat.v4.new_notebook(cells=list(cells))


def _log(*rows):
    return [{"index": i, "kind": kind, "status": status, "seconds": 0.1} for i, kind, status in rows]


def test_a_syntax_error_is_quoted_with_its_line():
    graded = _notebook(_cell(SOURCE_3_3, ["3.3"], 3, [SYNTAX]))
    [row] = failures(graded, _log((0, "answer", "error")))
    assert row == {"questions": ["3.3"], "status": "error", "error": "SyntaxError: expected ':'", "quoted": True,
                   "line": 2, "text": "def average_gradients(model, world_size)"}


def test_the_line_is_the_cells_own_even_when_an_earlier_cell_raised():
    # 3.4's line 2 calls a function of 3.3's cell, which divides by zero at its line 2: 3.4's line is quoted.
    error = {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
             "traceback": ["\x1b[31m----\x1b[39m", _frame(5, 2) + "b = f(0)", _frame(4, 2) + "return 1/x",
                           "ZeroDivisionError: division by zero"]}
    graded = _notebook(_cell("def f(x):\n    return 1/x\n", ["3.3"], 4),
                       _cell("a = 1\nb = f(0)\n", ["3.4"], 5, [error]))
    [row] = failures(graded, _log((0, "answer", "ok"), (1, "answer", "error")))
    assert (row["questions"], row["error"], row["line"], row["text"]) == (["3.4"], "ZeroDivisionError: division by "
                                                                          "zero", 2, "b = f(0)")


def test_a_forged_traceback_names_no_line():
    # _render_traceback_ lets an exception print any traceback: a line outside the cell is not quoted.
    error = {"output_type": "error", "ename": "E", "evalue": "x", "traceback": ["Cell In[7], line 99"]}
    [row] = failures(_notebook(_cell("raise E('x')\n", ["1.1"], 7, [error])), _log((0, "answer", "error")))
    assert (row["error"], row["line"], row["text"]) == ("E: x", None, None)


def test_a_message_holding_the_graders_code_is_not_shown():
    # A later answer cell reads a probe cell's source in the kernel's history (In) and raises it: its setup, or
    # only the probe's nonce or seed. Read by a route the scan does not name, the message is withheld for what it
    # holds; read through `In`, for the route, whatever it holds (it may be encoded).
    probe = _cell(PROBE, [], 4, kind="probe")
    for leaked in ("In[4]: " + PROBE[60:200], "nonce 9f3ac0d1e2b4a687", "seed=1357913579", "_secret_setup_value = 1;"):
        error = {"output_type": "error", "ename": "ValueError", "evalue": leaked, "traceback": [_frame(5, 1)]}
        for source, said in (("raise ValueError(history[4])\n", GRADER_CODE), ("raise ValueError(In[4])\n", REACHES)):
            graded = _notebook(probe, _cell(source, ["3.3"], 5, [error]))
            [row] = failures(graded, _log((1, "answer", "error")))
            assert (row["error"].removesuffix(" (uses `In`)"), row["quoted"]) == (said, False), leaked
            text = _feedback(row)
            assert said in text and "9f3ac0d1" not in text and "1357913579" not in text, text
    assert Secrets(["x = 1; a private line of setup"]).holds_code("a private line of setup")
    assert not Secrets([PROBE]).holds_code("name 'average_gradients' is not defined")


def test_a_timed_out_and_a_killed_cell_say_so():
    interrupted = {"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                   "traceback": [_frame(2, 3) + "pass"]}
    killed = {"output_type": "stream", "name": "stderr",
              "text": "[grader] it hit the limit on processes and threads (a fork bomb?), so its kernel was killed; "
                      "a new kernel replayed the earlier cells and grading went on\n"}
    graded = _notebook(_cell("x = 1\nwhile True:\n    pass\n", ["1.1"], 2, [interrupted]),
                       _cell("import os\nwhile True: os.fork()\n", ["1.2"], 3, [killed]))
    hung, bomb = failures(graded, _log((0, "answer", "timeout"), (1, "answer", "error")))
    assert (hung["error"], hung["line"], hung["text"]) == ("ran past its time limit and was stopped", 3, "pass")
    assert (bomb["error"], bomb["quoted"], bomb["line"]) == (
        "it hit the limit on processes and threads (a fork bomb?), so its kernel was killed", False, None)
    assert failures(graded, _log((0, "lab", "error"), (1, "replay-answer", "error"))) == []


def _feedback(row, status="error"):
    marks = {"3.3": [{"name": "averages", "points": 3, "earned": 0.0, "quoted": True,
                      "message": "a rank failed: rank 0 raised NameError: name 'average_gradients' is not defined"}]}
    result = {"student": "frank", "status": status, "marks": marks, "cell_errors": [row]}
    return feedback_markdown(result, ["3.3"], {"3.3": 3})


def test_the_feedback_quotes_the_students_error_ahead_of_what_follows():
    graded = _notebook(_cell(SOURCE_3_3, ["3.3"], 3, [SYNTAX]))
    text = _feedback(failures(graded, _log((0, "answer", "error")))[0])
    lines = text.splitlines()
    quoted = "raised `SyntaxError: expected ':'` at line 2: `def average_gradients(model, world_size)`"
    assert lines[2] == f"Score: 0 / 3. Status: error (your answer cell for 3.3 {quoted}).", text
    section = lines[lines.index("## Question 3.3: 0 / 3") + 1:]
    assert section[0] == f"- your answer cell {quoted}: fix this first, the failures below may follow from it"
    assert section[1].startswith("- averages: failed: `a rank failed: rank 0 raised NameError"), text


def test_a_forged_error_stays_one_line_of_code():
    forged = {"output_type": "error", "ename": "Bad\n## Question 3.3: 3 / 3", "evalue": "<img src=x onerror=1>`",
              "traceback": [_frame(3, 1)]}
    row = failures(_notebook(_cell("raise Bad()\n# ## Score: 10\n", ["3.3"], 3, [forged])),
                   _log((0, "answer", "error")))[0]
    lines = _feedback(row).splitlines()
    assert [line for line in lines if line.startswith("## ")] == ["## Question 3.3: 0 / 3"]
    assert "`` Bad ## Question 3.3: 3 / 3: <img src=x onerror=1>` `` at line 1: `raise Bad()`" in lines[2], lines[2]
