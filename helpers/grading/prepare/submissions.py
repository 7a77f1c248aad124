r"""Which entries of SUBMISSIONS are submissions, and reading one without trusting it.

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

A student's id is their file's name without `.ipynb`, and it names their files in OUT (results/<id>.json,
feedback/<id>.md, executed/<id>.ipynb, logs/<id>.log, return/<id>/, manual/<question>/<id>.md) and their row of every
CSV. `name_problem` refuses a name that cannot be one, as an `error` row saying why (`listing`):

| name (before .ipynb) | what it did before | now |
|---|---|---|
| not UTF-8 (an old zip's `caf\xe9`) | no grades.csv, feedback or LMS file for anyone: `make grade` exit 2 | refused |
| a control or invisible character (newline, right-to-left override) | a name shown reversed | refused |
| `..`, `.`, `.x` | `..`'s returns skipped, a hidden file | refused |
| `x.`, `x ` | Windows drops the trailing dot or space: `x`'s files | refused |
| CON, NUL, COM1, LPT1 (any case, any extension) | files Windows cannot hold, in return/ | refused |
| `< > : " \ \| ? * %` in it | files Windows cannot hold; `%` is what refused ids are made of | refused |
| `grader` (any case) | its kernel's output appended to logs/grader.log, the grader's own | refused |
| over MAX_ID_BYTES bytes | a file name over the system's 255 bytes: no result | refused |
| `state`, `grades`, `similarity` | results/state.json, ...: no file of the grader's is in those folders | graded |

A refused entry's id is `refused_id`: `%` and its name's bytes, every one but ASCII letters, digits, `_` and `-`
percent-encoded (`caf\xe9` -> `%caf%E9`), cut at 100 characters with a hash: no valid id holds `%`, so a refused one
never names another student's files, and it can be told back into the file's name.
"""
import dataclasses
import errno
import hashlib
import json
import os
import pathlib
import re
import stat
import unicodedata

import nbformat

MAX_BYTES = 50 * 2**20  # a lab notebook with its outputs is under 1 MiB; the cap only stops a hostile one
NOT_REGULAR = "not a regular file (a symlink, a pipe or a device): hand in the notebook itself"


MAX_ID_BYTES = 200  # student ids of LMS exports are under 40; executed/<id>.ipynb stays below a file name's 255
_WINDOWS = {"con", "prn", "aux", "nul", *(f"{port}{n}" for port in ("com", "lpt") for n in range(10))}
_NOT_IN_IDS = set('<>:"\\|?*%')
_GRADERS = {"grader"}  # logs/grader.log
_RENAME = "rename the file to the student's id, e.g. alice_smith.ipynb, and grade it again (ONLY=...)"


def name_problem(student):
    """Why a file name (without .ipynb) cannot be a student's id, or None: the module's table."""
    try:
        student.encode("utf-8")
    except UnicodeEncodeError:  # os.listdir gives undecodable bytes as lone surrogates (PEP 383)
        return f"its file name is not UTF-8 text: {_RENAME}"
    if any(unicodedata.category(c).startswith(("C", "Z")) and c != " " for c in student):
        return f"its file name holds a control or invisible character: {_RENAME}"
    if student.startswith(".") or not student:
        return f"its file name starts with a dot (a hidden file, or . and ..): {_RENAME}"
    if student.endswith((".", " ")):
        return f"its file name ends in a dot or a space, which Windows drops (another student's name): {_RENAME}"
    if student.split(".")[0].rstrip(" ").lower() in _WINDOWS:
        return f"its file name is one Windows reserves for a device (CON, NUL, COM1, ...): {_RENAME}"
    if _NOT_IN_IDS & set(student):
        return f"its file name holds one of < > : \" \\ | ? * %, which Windows file names cannot: {_RENAME}"
    if student.casefold() in _GRADERS:
        return f"its file name is the grader's own log's (logs/grader.log): {_RENAME}"
    if len(student.encode("utf-8")) > MAX_ID_BYTES:
        return f"its file name is longer than {MAX_ID_BYTES} bytes: {_RENAME}"
    return None


_PLAIN = re.compile(rb"[A-Za-z0-9_-]")


def refused_id(student):
    """The id of an entry whose name name_problem refuses: "%" and its bytes, all but [A-Za-z0-9_-] as %XX."""
    raw = os.fsencode(student)
    text = "%" + "".join(chr(b) if _PLAIN.fullmatch(bytes([b])) else f"%{b:02X}" for b in raw)
    if len(text) > 100:
        text = f"{text[:87]}~{hashlib.sha256(raw).hexdigest()[:12]}"
    return text


def shown_name(student):
    """The entry's file name as Python writes it (escapes for what is not printable UTF-8), for a message."""
    name = os.fsencode(student + ".ipynb").decode("utf-8", "backslashreplace")
    name = ascii(name)[1:-1] if not name.isprintable() else name
    return name if len(name) <= 120 else f"{name[:100]}...{name[-10:]}"


@dataclasses.dataclass(frozen=True)
class Refused:
    """An entry of SUBMISSIONS that is never read, in place of its path: why (listing's refused)."""

    why: str


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
        bad_name = name_problem(path.name[:-len(".ipynb")])
        if bad_name:  # never read: its id is one the grader makes (refused_id), the reason names the file
            refused[refused_id(path.name[:-len(".ipynb")])] = f"{shown_name(path.name[:-len('.ipynb')])}: {bad_name}"
        elif stat.S_ISREG(mode):
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
    """The nbformat v4 notebook at path, its lone surrogates replaced (scrub); SubmissionError when it is not a
    regular file or not a notebook."""
    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
        return scrub(nbformat.reads(text, as_version=4), text)
    except Exception as exc:  # noqa: BLE001 - whatever nbformat raises, the message must not quote the file
        raise SubmissionError(f"not a readable notebook ({_where(exc)}): save it again from Jupyter as .ipynb "
                              "and hand that file in") from None


def _where(exc):
    """What broke, without the file's text: the exception's type, and the JSON error's line and column."""
    cause = exc.__cause__ if isinstance(exc.__cause__, json.JSONDecodeError) else exc
    if isinstance(cause, json.JSONDecodeError):
        return f"invalid JSON at line {cause.lineno} column {cause.colno}"
    return type(exc).__name__


# JSON may escape half a surrogate pair ("\\ud800"): Python reads it as a str no UTF-8 file can hold, so writing the
# notebook, a report or a CSV that quotes it raised UnicodeEncodeError and ended the class's run (issue 29).
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(value, text=None):
    """value (parsed JSON: dicts, lists, strings) with each lone surrogate in a string or key replaced by U+FFFD, in
    place where it can be; text: the JSON it was parsed from, to skip the walk when it escapes none."""
    if text is not None and not _ESCAPED_SURROGATE.search(text):
        return value
    stack = [value] if isinstance(value, (dict, list)) else []
    while stack:  # no recursion: JSON nests as deep as the parser allows
        node = stack.pop()
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, item in items:
            if isinstance(node, dict) and isinstance(key, str) and _SURROGATE.search(key):
                del node[key]
                key = _fixed(key)
            node[key] = _fixed(item)
            if isinstance(item, (dict, list)):
                stack.append(item)
    return _fixed(value)


def _fixed(value):
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else value
