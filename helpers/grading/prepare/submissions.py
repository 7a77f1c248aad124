"""Which entries of SUBMISSIONS are submissions, and reading one without trusting it.

The grader reads the submissions as the instructor (often root) outside the sandbox, so an entry of the directory
is read with the grader's rights. Only a student's own regular file is a submission:

| entry named x.ipynb | what reading it did before | now |
|---|---|---|
| symlink to solutions/NN_*.ipynb | graded the solution: full marks | `error` row: NOT_REGULAR |
| symlink to a probe file | its first characters in the feedback (nbformat quotes a file that is not JSON) | same |
| FIFO | blocked that student until the hard limit, then the similarity report for ever | same, at once |
| symlink to /dev/zero, a device | memory grew without bound | same |
| a directory | an error naming the path | same |
| a regular file over MAX_BYTES | read whole | `error` row naming the limit |

`listing` tells them apart with lstat, never opening one; `read_notebook` opens with O_NOFOLLOW | O_NONBLOCK and
checks the open file again (an entry swapped after the listing is still refused), and reads at most MAX_BYTES + 1.
No message here quotes a file: a student can copy a secret into one and hand it in to see it echoed.
"""
import errno
import json
import os
import pathlib
import stat

import nbformat

MAX_BYTES = 50 * 2**20  # a lab notebook with its outputs is under 1 MiB; the cap only stops a hostile one
NOT_REGULAR = "not a regular file (a symlink, a pipe or a device): hand in the notebook itself"


class SubmissionError(ValueError):
    """A submission that cannot be read; the message says what the student should do and quotes nothing of it."""


def listing(directory):
    """({student: path} of the regular *.ipynb files, {student: why} of every other *.ipynb entry)."""
    regular, refused = {}, {}
    for path in sorted(pathlib.Path(directory).glob("*.ipynb")):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:  # removed since the directory was listed
            continue
        if stat.S_ISREG(mode):
            regular[path.stem] = str(path)
        else:
            refused[path.stem] = NOT_REGULAR
    return regular, refused


def read_bytes(path):
    """The bytes of path if it is a regular file (not through a symlink) of at most MAX_BYTES."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # never open a device: opening some has effects
            raise SubmissionError(NOT_REGULAR)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):  # a symlink (swapped in after lstat), or gone
            raise SubmissionError(NOT_REGULAR) from None
        raise SubmissionError(f"the notebook could not be opened ({exc.strerror}): hand it in again") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise SubmissionError(NOT_REGULAR)
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise SubmissionError(f"the notebook is larger than {MAX_BYTES} bytes, the grader's limit: clear its "
                              "outputs (Edit > Clear All Outputs in Jupyter), save it and hand it in again")
    return data


def read_notebook(path):
    """The nbformat v4 notebook at path; SubmissionError when it is not a regular file or not a notebook."""
    data = read_bytes(path)
    try:
        return nbformat.reads(data.decode("utf-8"), as_version=4)
    except Exception as exc:  # noqa: BLE001 - whatever nbformat raises, the message must not quote the file
        raise SubmissionError(f"not a readable notebook ({_where(exc)}): save it again from Jupyter as .ipynb "
                              "and hand that file in") from None


def _where(exc):
    """What broke, without the file's text: the exception's type, and the JSON error's line and column."""
    cause = exc.__cause__ if isinstance(exc.__cause__, json.JSONDecodeError) else exc
    if isinstance(cause, json.JSONDecodeError):
        return f"invalid JSON at line {cause.lineno} column {cause.colno}"
    return type(exc).__name__
