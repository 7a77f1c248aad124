"""Malformed iopub messages through the grader's message handling (helpers/grading/run/messages.py, execute.py):
none makes it raise, and the notebook it leaves is one every later step can write and read.

No kernel runs here: the messages go straight into the grader's NotebookClient, as its iopub channel would hand them
over. The same attack through a real sandboxed kernel is tests/grading/test_one_student.py (the `surrogate` student).
Before: a stream without `name`, an error without `ename`, a status without `execution_state` raised KeyError, `data`
that was a string failed nbformat's validation, half a surrogate pair could not be written (UnicodeEncodeError), and
the student's grading process died: `grader_error` and a blank LMS grade on every re-grade.
"""
import itertools
import json

import nbformat
import pytest
from nbclient.exceptions import CellExecutionComplete

from helpers.grading.judge.answer_errors import failures
from helpers.grading.judge.redact import Secrets
from helpers.grading.report.returns import returned
from helpers.grading.run import messages
from helpers.grading.run.execute import _CappedClient, _errored

pytestmark = pytest.mark.timeout(120)

TYPES = ["stream", "display_data", "execute_result", "error", "clear_output", "update_display_data", "status",
         "execute_input", "comm_open", "comm_msg", "surprise", ""]


def _deep(depth):
    value = "bottom"
    for _ in range(depth):
        value = [value]
    return value


CONTENTS = [
    {}, None, [], "text", 5, {"name": 1, "text": None}, {"name": "stdout", "text": ["a", 1]},
    HALF_PAIR := {"name": "stdout", "text": "half \ud800 a pair \udfff"}, {"text": "no name"},
    {"data": "x", "metadata": []}, {"data": None}, {"data": {1: "x", None: "y", "text/plain": 5}},
    IMAGES := {"data": {"bad mime": "x", "text/plain": ["a", "b"], "image/png": "!!not base64", "image/jpeg": "aGk="}},
    {"data": {"application/json": {"v": float("nan"), "w": float("inf")}}, "metadata": {"k": float("nan")}},
    {"data": {"application/json": _deep(10_000)}, "metadata": {}}, {"data": {"text/plain": "x"}, "metadata": None},
    {"data": {"text/plain": "\ud800"}, "metadata": {"\udc00": 1}, "execution_count": "7"},
    {"data": {}, "execution_count": True}, {"data": {}, "execution_count": 2**80}, {"execution_count": None},
    {"data": {}, "transient": None}, {"data": {}, "transient": "x"}, {"data": {}, "transient": {"display_id": 5}},
    {"data": {"text/plain": "shown"}, "metadata": {}, "transient": {"display_id": "d1"}},
    {"ename": None, "evalue": 5, "traceback": "tb"}, {"ename": "E", "evalue": "v", "traceback": [1, None, "x"]},
    {"ename": "E"}, {"wait": "yes"}, {"wait": None}, {"execution_state": None}, {"execution_state": 5},
    {"execution_state": "busy"}, {"comm_id": 1, "data": None}, {"comm_id": "c", "data": {"state": 5}},
    {"comm_id": "c", "target_name": None, "data": {}}, {"text": "x" * 2_000_000, "name": "stdout"},
    {"\ud800": {"\udc00": ["\ud800"]}}, {"data": {"text/plain": "x" * 10}, "metadata": _deep(40)},
]


def _messages():
    """(msg_type, message) for every type x content, and messages malformed around their content."""
    for msg_type, content in itertools.product(TYPES, CONTENTS):
        yield msg_type, {"msg_type": msg_type, "header": {"msg_type": msg_type}, "parent_header": {"msg_id": "p"},
                         "metadata": {}, "content": content, "buffers": []}
    for msg_type in ("stream", "display_data", "status"):
        good = {"msg_type": msg_type, "header": {"msg_type": msg_type}, "parent_header": {"msg_id": "p"},
                "content": {"name": "stdout", "text": "x"}}
        for broken in ({"content": None}, {"parent_header": None}, {"header": None}, {"msg_type": None},
                       {"msg_type": 5}, {"metadata": "m"}):
            yield msg_type, {**good, **broken}
        yield msg_type, {k: v for k, v in good.items() if k != "content"}
        yield msg_type, {k: v for k, v in good.items() if k != "parent_header"}
    yield "none", None
    yield "list", []


def _notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"dp_course_kind": "answer", "dp_course": {"answers":
                                                              ["1.1"]}}),
                nbformat.v4.new_code_cell("", metadata={"dp_course_kind": "probe", "dp_course_question": "1.1"})]
    for cell in nb.cells:
        cell.metadata["execution"] = {}
    return nb


def test_no_message_makes_the_grader_raise_and_the_notebook_stays_writable():
    nb = _notebook()
    client = _CappedClient(nb, km=None)
    client.reset_execution_trackers()  # as execute_cell does before a cell
    client.clear_before_next_output = False
    client.running = 0, nb.cells[0]  # the cell being run (execute.py sets it)
    cell, complete, shown = nb.cells[0], 0, []
    for msg_type, msg in _messages():
        client.used_chars.clear()  # each message as the first of its cell: the output cap is execute.py's test
        try:
            client.process_message(msg, cell, 0)
        except CellExecutionComplete:  # a well-formed idle status: the cell's end, as nbclient signals it
            complete += 1
        # After every message the notebook is one the grader can write (UTF-8, valid nbformat) and read back.
        text = nbformat.writes(nb)
        text.encode("utf-8")
        nbformat.validate(nbformat.reads(text, as_version=4))
        if isinstance(msg, dict) and any(msg.get("content") is c for c in (HALF_PAIR, IMAGES)):
            shown.append(json.dumps(cell.outputs[-3:]))
    assert complete == 0, "no content above is a well-formed idle status"
    assert client.dropped > 0
    shown = "".join(shown)
    assert "half \\ufffd a pair \\ufffd" in shown and "aGk=" in shown and "!!not base64" not in shown, shown[:2000]
    # What later steps make of it: the cell's status, its quoted error, the notebook a student gets back.
    status = _errored(cell)
    cells = [{"index": 0, "kind": "answer", "status": status, "seconds": 0.0}]
    failures(nb, cells, Secrets())
    nbformat.validate(returned(nb, {"student": "s", "cells": cells, "kernels": 1}))


@pytest.mark.parametrize("msg_type", ["stream", "error", "status", "display_data", "execute_result", "clear_output"])
def test_the_message_of_each_type_that_raised_before(msg_type):
    # The shape a careless or hostile kernel sends most simply: the type with an empty content.
    msg = {"msg_type": msg_type, "header": {"msg_type": msg_type}, "parent_header": {"msg_id": "p"}, "content": {}}
    nb = _notebook()
    client = _CappedClient(nb, km=None)
    client.reset_execution_trackers()  # as execute_cell does before a cell
    client.clear_before_next_output = False
    client.running = 0, nb.cells[0]
    client.process_message(msg, nb.cells[0], 0)
    nbformat.validate(nb)


def test_cleaned_keeps_a_well_formed_message_as_it_is():
    msg = {"msg_type": "execute_result", "header": {"msg_type": "execute_result", "msg_id": "m"},
           "parent_header": {"msg_id": "p"}, "metadata": {},
           "content": {"data": {"text/plain": "3", "image/png": "aGk=", "application/json": {"a": [1, 2]}},
                       "metadata": {"isolated": True}, "execution_count": 3, "transient": {"display_id": "d"}}}
    assert messages.cleaned(msg) == msg
    stream = {**msg, "msg_type": "stream", "header": {"msg_type": "stream"},
              "content": {"name": "stderr", "text": "warning\n"}}
    assert messages.cleaned(stream) == stream
