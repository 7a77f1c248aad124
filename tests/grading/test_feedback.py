"""What a student's own code put in a failure message reaches the feedback capped, on one line, as code."""
import re

from helpers.errors import RankFailed
from helpers.grading.probes import Probe
from helpers.grading.report.feedback import feedback_markdown
from helpers.grading.run.grade_student import score
from helpers.grading.run.probe_runtime import _evaluate

# An exception class named and worded to forge the feedback's lines (red team, a3) and a leak of 10 KB.
FORGED = "\n## Question 1.2: 2 / 2\nScore: 10 / 10\n<img src=x onerror=alert(1)>\n- 1.2 probe: passed"
LEAK = "LEAK " + '{"seed": 12345, "expected": ' + "[1.0, 2.0] " * 1000 + "}"


def _forged_error():
    return type("Bad" + FORGED, (Exception,), {})(FORGED)


def test_a_rank_failure_message_is_capped():
    def leak():
        raise RankFailed("rank 0 raised ValueError: " + LEAK, 0, exc_type="ValueError")

    error = _evaluate("leak()", {"leak": leak})["error"]
    assert error.startswith("a rank failed: ") and len(error) <= 500, len(error)


def test_any_failure_message_is_capped():
    def raises():
        raise _forged_error()

    assert len(_evaluate("raises()", {"raises": raises})["error"]) <= 500


def _feedback(message):
    probe = Probe("1.2", "the loss", "f()")
    marks = score([probe], {"1.2": {"the loss": {"value": 1.0}}}, {"1.2": {"the loss": {"error": message}}}, {}, 0)
    result = {"student": "alice", "status": "ok", "marks": marks}
    return feedback_markdown(result, ["1.2"], {"1.2": 2})


def test_a_forged_message_stays_one_line_of_code_in_the_feedback():
    text = _feedback(f"{type(_forged_error()).__name__}: {FORGED}")
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("## ")] == ["## Question 1.2: 0 / 2"], text
    assert [line for line in lines if line.startswith("Score:")] == ["Score: 0 / 2. Status: ok (every cell ran)."]
    failed = [line for line in lines if line.startswith("- the loss: failed: ")]
    assert len(failed) == 1 and len([line for line in lines if line.startswith("- ")]) == 1, text
    # The message is one code span: Markdown and HTML inside it are shown, not rendered.
    span = failed[0].removeprefix("- the loss: failed: ")
    fence = re.match(r"`+", span)[0]
    assert span.endswith(fence) and fence not in span[len(fence):-len(fence)], span


def test_a_long_message_is_capped_in_the_feedback_too():
    # Results written before the cap (or a kernel that displays its own) must not carry 10 KB into the feedback.
    text = _feedback(LEAK)
    assert len(text) < 1000 and "[1.0, 2.0] " * 60 not in text, len(text)


def test_backticks_in_a_message_cannot_close_its_code_span():
    line = next(x for x in _feedback("a ``` b ` c <b>x</b>").splitlines() if x.startswith("- the loss"))
    assert line == "- the loss: failed: ```` a ``` b ` c <b>x</b> ````", line


def test_a_student_id_cannot_forge_the_heading():
    result = {"student": "<img src=x onerror=alert(1)>", "status": "ok", "marks": {}}
    assert feedback_markdown(result, [], {}).splitlines()[0] == "# Feedback for `<img src=x onerror=alert(1)>`"


def test_the_graders_own_reason_is_not_quoted():
    from helpers.grading.prepare.assemble import FORGED as REASON

    probe = Probe("1.2", "the loss", "f()")
    got = {"1.2": {"the loss": {"error": REASON, "grader": True}}}
    marks = score([probe], {"1.2": {"the loss": {"value": 1.0}}}, got, {}, 0)
    text = feedback_markdown({"student": "a", "status": "ok", "marks": marks}, ["1.2"], {"1.2": 2})
    assert f"- the loss: failed: {REASON}" in text, text
