"""The probes' pipe (helpers/grading/run/channel.py): only a line signed with its probe cell's nonce counts."""
import json
import os

import nbformat
import pytest

from helpers.grading.prepare.assemble import FORGED, probe_values
from helpers.grading.run import channel

pytestmark = pytest.mark.timeout(60)

NONCE = "5e1f0c9a2b7d4e11"
VALUES = {"question": "3.2", "results": [{"name": "one all-reduce", "value": [["all_reduce", 48]]}]}


def _graded():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f"_probe_run('3.2', '', [], {NONCE!r}, 1)")
    cell.metadata.update(dp_course_kind="probe", dp_course_question="3.2")
    nb.cells = [cell]
    return nb


def test_the_grader_reads_what_the_kernel_wrote_whole():
    # 3 MB: more than the pipe's buffer, so the kernel's write blocks until the reader takes it.
    big = {**VALUES, "results": [{"name": "batches", "value": ["x" * 1000] * 3000}]}
    pipe = channel.Channel()
    channel.send(pipe.fd, channel.record(NONCE, big) + b"garbage without a newline")
    lines = pipe.lines()
    assert pipe.fd is None and len(lines) == 1
    assert json.loads(channel.verified(lines, NONCE)[0]) == big


def test_only_the_nonce_signs_and_one_result_counts():
    real = channel.record(NONCE, VALUES).rstrip(b"\n")  # as Channel.lines() returns them
    forged = channel.record("guessed", {**VALUES, "results": [{"name": "one all-reduce", "value": "forged"}]})
    # Unsigned, signed with another key, or with a body changed after signing: dropped.
    unsigned = b"0" * 64 + b" " + json.dumps(VALUES).encode()
    edited = real.replace(b"48]", b"49]")
    lines = [forged.rstrip(b"\n"), unsigned, edited, b"", b"no space at all", real]
    assert probe_values(_graded(), "3.2", NONCE, lines) == {"one all-reduce": {"value": [["all_reduce", 48]]}}
    # A second line with the nonce (code that read it from the probe cell and wrote its own): nothing counts.
    assert probe_values(_graded(), "3.2", NONCE, [real, real]) == {"one all-reduce": {"error": FORGED,
                                                                                      "grader": True}}
    assert probe_values(_graded(), "3.2", NONCE, []) == {}, "no line: the probe did not run"
    # What the probe cell displayed is not read when the grader has the pipe's lines.
    shown = {"question": "3.2", "nonce": NONCE, **VALUES}
    _graded_shown = _graded()
    _graded_shown.cells[0].outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.dp-course.probe+json": shown})]
    assert probe_values(_graded_shown, "3.2", NONCE, []) == {}
    assert probe_values(_graded_shown, "3.2", NONCE) == {"one all-reduce": {"value": [["all_reduce", 48]]}}


def test_a_kernel_that_floods_the_pipe_is_read_and_dropped():
    pipe = channel.Channel(max_bytes=2**16)
    channel.send(pipe.fd, b"x" * 2**20)  # it would block for ever if nobody read
    assert pipe.lines() == [] and pipe.dropped >= 2**20 - 2**16
    read, write = os.pipe()
    os.close(read)
    with pytest.raises(BrokenPipeError):  # the kernel's write when the grader is gone: the probe cell fails
        channel.send(write, b"x\n")
    os.close(write)


def test_a_writer_that_outlives_its_kernel_cannot_hold_the_grader():
    # A daemon that escaped the kernel (no sandbox to kill it) and writes without pause: the grader drains the pipe
    # for DRAIN_SECONDS, then stops reading.
    import threading
    import time

    pipe = channel.Channel()
    stop = threading.Event()

    def spam(fd):
        try:
            while not stop.is_set():
                os.write(fd, b"y" * 4096)
        except OSError:  # the grader closed its end
            pass

    writer = os.dup(pipe.fd)
    thread = threading.Thread(target=spam, args=(writer,), daemon=True)
    thread.start()
    begun = time.monotonic()
    pipe.lines()
    assert time.monotonic() - begun < channel.DRAIN_SECONDS + 2
    stop.set()
    thread.join(5)
    os.close(writer)
