"""What a student is never shown: a piece of a probe cell, or a number of a hidden test's inputs.

Once a hidden test ran, the kernel holds its cell (in the history, `In`; its frames' locals: the SETUP of a private
PROBES= file, the solution's earlier answers, the nonce, the secret seed), and an answer a probe calls holds the
probe's inputs as its own arguments. Student code can raise any of it into a message the grader quotes. Every text
that reaches a file a student reads (OUT/feedback/, OUT/return/) or a reason the grader keeps (results/*.json) passes
`Secrets.quoted` (the student's text) or `Secrets.said` (the grader's own, which may carry a value the student chose):

- quoted, from code that ran on hidden inputs (a probe's call; an answer cell after the first probe cell): every
  number of 2 or more digits or with a point, and every hex run of 8 or more, is made `…` (a single digit stays: a
  rank, a dimension);
- quoted, holding WINDOW letters in a row of a probe or fill cell that no other cell of the graded notebook holds (the
  released lab's, the student's answers): WITHHELD, whole. Case, digits, spaces, quotes, a repr's escapes and
  punctuation are ignored, so a quote cut into pieces or escaped twice still counts;
- quoted or said, holding a seed or a nonce of the run, even with other characters between its digits, or quoted,
  holding a long number or hex run of a probe cell: WITHHELD, whole;
- raised on hidden inputs by answers that read the kernel's history, frames or the grader's code (a name the source
  scan refuses, shortcuts.refusal): not quoted at all, whatever it holds (REACHES; grade_student.score gives the
  scan's reason), so that no encoding of what they read gets through.

The probe and fill cells carry everything secret: the SETUP, the references' sources, the nonce and the question's
seed are all written into them (assemble.py), so the graded notebook alone says what to withhold; `seeds` adds the
run's and the student's. An answer can still encode its own arguments (the probe's inputs: in words, in base 26)
into a message: not caught, but a re-grade of other bytes draws other inputs (state.probe_seed), so what it leaked is
worth nothing to the next submission.
"""
import json
import re

from helpers.grading.judge.reference import leaked_lines

WINDOW = 16  # letters in a row shared with a probe cell: withheld
PUBLIC_CHARS = 200_000  # of each cell the student may see, compared with the probe cells (answers are under 7,000)
WITHHELD = ("the message quoted the grader's hidden code or a hidden test's seed, so it is not shown: raise messages "
            "of your own")
REACHES = ("its message is not shown: your answer cells up to it read the kernel's history, its frames or the "
           "grader's own code")
MASK = "…"
_ESCAPE = re.compile(r"\\+[nrtx'\"]")  # a repr's escapes, once or repr'd again: "\\n" is a line break, not an "n"
_NOT_LETTER = re.compile(r"[^a-z]+")
# A probe cell ends `'<nonce>', <question seed>)` or `'<nonce>', <question seed>, {reference})` (assemble.py).
_CALL = re.compile(r"'([0-9a-f]{16})', (\d+)[,)]")
_LONG = re.compile(r"(?<![0-9a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}(?![0-9a-f])|\d{6,}")
_NUMBER = re.compile(r"(?<!\w)(?=[0-9a-f]*\d)[0-9a-f]{8,}(?!\w)|"
                     r"(?<![\w.])(?:\d+\.\d+|\.\d+|\d{2,}|\d(?=[eE][-+]?\d))(?:[eE][-+]?\d+)?")
SECRET_KINDS = ("probe", "fill")


def letters(text):
    """Only the letters of text, lower-cased, a repr's escapes dropped first."""
    return _NOT_LETTER.sub("", _ESCAPE.sub(" ", str(text)).lower())


def _windows(text):
    return set(_each_window(text))


def _each_window(text):
    stream = letters(text)
    return (stream[i:i + WINDOW] for i in range(len(stream) - WINDOW + 1))


def mask_numbers(text):
    """text with every number of 2+ digits or with a point (and every hex run of 8+ with a digit) made MASK."""
    return _NUMBER.sub(MASK, str(text))


class Secrets:
    """What one graded notebook's student may not be shown (module docstring)."""

    def __init__(self, texts=(), public=(), seeds=(), code=()):
        """texts: the probe and fill cells' sources; public: texts the student may see (what they share with texts
        is not secret); seeds: the run's and the student's; code: the SETUP and the references' sources as written
        (a grader's message holding one of their lines is withheld too: reference.leaked_lines)."""
        texts, self.code = [*texts, *code], tuple(code)
        secret = set().union(*map(_windows, texts)) if texts else set()
        # The public windows a probe cell also holds, looked up on each public text's first PUBLIC_CHARS: a set of all
        # of a hostile 4 MB answer's windows cost 2.5 CPU-s and 550 MiB of the grader's own process per student (issue
        # 29). A window shared only further on stays secret: a message holding it is withheld, never shown.
        shared = {w for text in public for w in _each_window(str(text)[:PUBLIC_CHARS]) if w in secret}
        self.windows = secret - shared
        calls = [part for text in texts for call in _CALL.findall(str(text)) for part in call]
        self.seeds = {str(s) for s in (*seeds, *calls) if len(str(s)) >= 5}  # found even with their digits split
        self.numbers = {t for text in texts for t in _LONG.findall(str(text))}  # found whole

    @classmethod
    def of_notebook(cls, graded, seeds=(), code=()):
        """The secrets of a graded notebook (dict or NotebookNode): its probe and fill cells, less what its other
        cells hold."""
        cells = (graded or {}).get("cells", [])
        kinds = [c.get("metadata", {}).get("dp_course_kind") for c in cells]
        source = [_source(c) for c in cells]
        return cls([s for s, k in zip(source, kinds) if k in SECRET_KINDS],
                   [s for s, k in zip(source, kinds) if k not in SECRET_KINDS], seeds, code)

    @classmethod
    def of_file(cls, path, seeds=()):
        """of_notebook of an executed notebook on disk (OUT/executed/<student>.ipynb); none there: only the seeds."""
        try:
            with open(path) as f:
                return cls.of_notebook(json.load(f), seeds)
        except (OSError, ValueError):
            return cls(seeds=seeds)

    def holds_seed(self, text):
        """Whether text holds a seed or a nonce of the run, even with other characters between its digits."""
        text = str(text)
        digits, hexes = re.sub(r"\D", "", text), re.sub(r"[^0-9a-f]", "", text.lower())
        return any(s in (digits if s.isdigit() else hexes) for s in self.seeds)

    def holds_number(self, text):
        """Whether text holds a seed or a nonce (holds_seed), or a long number or hex run of a probe cell whole."""
        return self.holds_seed(text) or any(n in str(text) for n in self.numbers)

    def holds_code(self, text):
        """Whether text holds WINDOW letters in a row of a probe or fill cell that the notebook's other cells do
        not hold."""
        # Window by window, never a set of them all: an output of 1,000,000 letters built one of 350 MiB (0.6 CPU-s).
        return bool(self.windows) and any(w in self.windows for w in _each_window(text))

    def guard(self, text):
        """The student's text, or WITHHELD if it holds a seed, a nonce or a piece of a probe cell."""
        return WITHHELD if self.holds_number(text) or self.holds_code(text) else text

    def quoted(self, text, hidden_inputs=True):
        """The student's text as it may be shown: WITHHELD, or with its numbers masked if it ran on hidden inputs."""
        text = self.guard(text)
        return mask_numbers(text) if hidden_inputs and text != WITHHELD else str(text)

    def said(self, text):
        """The grader's own text (a judge's line may show a value the student returned, or quote an answer): WITHHELD
        if it holds a seed, a nonce or a line of the SETUP or a reference."""
        return WITHHELD if self.holds_seed(text) or leaked_lines(text, *self.code) else text


def _source(cell):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def guarded(result, secrets):
    """A copy of a result (results/<student>.json) whose texts from the kernel pass secrets once more, as the feedback
    is written: a result kept by RESUME=1 may come from a grader that withheld less."""
    marks = {q: [_mark(m, secrets) for m in ms] for q, ms in (result.get("marks") or {}).items()}
    rows = []
    for row in result.get("cell_errors") or []:
        error = row.get("error")
        error = secrets.guard(error) if row.get("quoted") else secrets.said(error) if error else error
        text = row.get("text") if row.get("text") and secrets.guard(row["text"]) != WITHHELD else None
        rows.append({**row, "error": error, "quoted": bool(row.get("quoted")) and error != WITHHELD, "text": text})
    composition = {q: secrets.said(t) for q, t in (result.get("composition") or {}).items()}
    return {**result, "marks": marks, "cell_errors": rows, "composition": composition,
            **({"error": secrets.said(result["error"])} if result.get("error") else {})}


def _mark(mark, secrets):
    if "message" not in mark:
        return mark
    if mark.get("quoted"):
        message = secrets.guard(mark["message"])
        return {**mark, "message": message, "quoted": message != WITHHELD}
    return {**mark, "message": secrets.said(mark["message"])}
