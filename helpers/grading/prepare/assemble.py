"""The notebook that is graded: the released lab, the student's answer cells, probe cells.

Only answer cells (tagged by `make labs` with the questions they answer) come from the submission;
every other cell comes from the released lab, so editing a check cell changes nothing. After each
answer cell, a probe cell evaluates that question's hidden tests and sends their values to the grader (run/channel.py).
Public check cells are kept but not run: they only report, and they cost time. So are the lab's cells after its
last answer ("after"): no probe follows them, so they cannot change a mark (lab 10's closing training run: ~3 s).
"""
import hashlib
import json
import re
import secrets

import nbformat

from helpers.grading.probes.shortcuts import as_scanned
from helpers.grading.run.channel import verified
from helpers.grading.run.probe_runtime import PROBE_MIMETYPE

_DEFINES = re.compile(r"^(?:def|class)\s+(\w+)", re.M)
_CHECK = re.compile(r"""check\(\s*["'][\w.]+["']\s*,\s*globals\(\)\s*\)""")


def answer_questions(cell):
    """The questions a released lab cell answers ([] for other cells)."""
    return cell.get("metadata", {}).get("dp_course", {}).get("answers", [])


def _is_check(cell):
    """A public check cell: it only reports, so grading skips it (probes do the grading)."""
    return cell.cell_type == "code" and _CHECK.fullmatch(cell.source.strip()) is not None


def find_answer(released_cell, submission):
    """The submission's version of an answer cell: same cell id, else the cell defining the same names."""
    for cell in submission.cells:
        if cell.get("id") == released_cell.get("id") and cell.cell_type == "code":
            return cell.source
    names = set(_DEFINES.findall(released_cell.source))
    for cell in submission.cells:
        if cell.cell_type == "code" and names and names <= set(_DEFINES.findall(cell.source)):
            return cell.source
    return None


def question_seed(seed, question):
    """The secret seed of one question's probe inputs: a probe cell shows only its own question's seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{question}".encode()).digest()[:4], "big") % 2**31


def probe_source(question, setup, probes, nonce, seed, reference=None):
    """Code of a probe cell: evaluate each probe expression in the notebook's namespace (with the solution's versions
    of the earlier answers it calls bound, when reference is given: helpers/grading/judge/reference.py)."""
    calls = [(p.name, p.expr) for p in probes]
    more = f", {reference!r}" if reference else ""
    return (
        "from helpers.grading.run.probe_runtime import run_probes as _probe_run\n"
        f"_probe_run({question!r}, {setup!r}, {calls!r}, {nonce!r}, {question_seed(seed, question)!r}{more})\n"
    )


def assemble(released, submission, setup, probes, seed, references=None):
    """(graded notebook, {question: nonce}, [questions whose answer cell was not found]).

    seed: the grading run's secret probe seed (an int); each probe cell carries only its own question's seed,
    question_seed(seed, question), from which that question's probe inputs derive.
    references: {question: reference} of the questions whose probes call earlier answers (reference.references)."""
    graded = nbformat.v4.new_notebook(metadata=released.metadata)
    nonces, missing = {}, []
    # A question may span several answer cells (two functions): probe it once, after its last one.
    last_cell = {q: i for i, cell in enumerate(released.cells) for q in answer_questions(cell)}
    first_cell = {q: i for i, cell in reversed(list(enumerate(released.cells))) for q in answer_questions(cell)}
    last_answer = max(last_cell.values(), default=len(released.cells))
    for index, cell in enumerate(released.cells):
        questions = answer_questions(cell)
        copy = nbformat.from_dict(json.loads(json.dumps(cell)))
        if questions:
            source = find_answer(cell, submission)
            if source is None:
                missing += questions
            else:
                copy.source = source
        copy.metadata["dp_course_kind"] = ("answer" if questions else "check" if _is_check(cell)
                                           else "after" if index > last_answer else "lab")
        for question in questions:  # names its answer needs to be defined at all, where the student's is missing
            reference = (references or {}).get(question)
            if reference and reference.get("define") and index == first_cell[question]:
                needed = {"source": reference["source"], "define": reference["define"]}
                fill = nbformat.v4.new_code_cell("from helpers.grading.run.probe_runtime import fill_missing as "
                                                 f"_probe_fill\n_probe_fill({needed!r})\n")
                fill.metadata["dp_course_kind"] = "fill"
                graded.cells.append(fill)
        graded.cells.append(copy)
        for question in dict.fromkeys(q for q in questions if last_cell[q] == index):  # a cell may hold 2 regions
            mine = [p for p in probes if p.question == question]
            if mine:
                nonces[question] = secrets.token_hex(8)
                probe = nbformat.v4.new_code_cell(probe_source(question, setup, mine, nonces[question], seed,
                                                               (references or {}).get(question)))
                probe.metadata["dp_course_kind"] = "probe"
                probe.metadata["dp_course_question"] = question
                graded.cells.append(probe)
    return graded, nonces, missing


FORGED = "the probe cell sent a result that was not the probe's: an answer sent one of its own, so none counts"


def probe_values(graded, question, nonce, records=None):
    """{probe name: {"value"| "error": ...}} sent by the probe cell of question, if any; with "own": {"value"|
    "error": ...} too where the probes ran again with the student's own earlier answers (reference.py).

    records: the lines of the probes' pipe (execute.Execution.records: what the grader reads); the probe cell sends
    one, signed with its nonce (run/channel.py). Code run in that cell (an answer called by a probe) can read its
    source, nonce included, and send a result of its own: then the question gets nothing but FORGED, under the names
    either result claims. records None: what the probe cell displayed (a kernel without the pipe: tests/test_labs.py),
    by the same rule."""
    if records is not None:
        shown = [_results(_json(body)) for body in verified(records, nonce)]
        shown = [(q, nonce, results) for q, _, results in shown if q == question]
        return _one(shown, question, nonce)
    for cell in graded.cells:
        if cell.metadata.get("dp_course_kind") != "probe" or cell.metadata.get("dp_course_question") != question:
            continue
        if f"{nonce!r}" not in cell.source:
            continue  # another probe cell of the question (tests/test_labs.py runs one per secret seed)
        shown = [_results(o["data"][PROBE_MIMETYPE]) for o in cell.get("outputs", [])
                 if PROBE_MIMETYPE in o.get("data", {})]
        return _one(shown, question, nonce)
    return {}


def _one(shown, question, nonce):
    """The results of the one result shown; FORGED under every name when there are more."""
    if len(shown) == 1 and shown[0][:2] == (question, nonce):
        return shown[0][2]
    return {name: {"error": FORGED, "grader": True} for _, _, results in shown for name in results}


def _json(body):
    try:
        return json.loads(body)
    except ValueError:
        return None


def _results(data):
    """(question, nonce, {name: result}) of one displayed probe result, whatever the kernel sent."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        return None, None, {}
    # Only the value or the error: a "grader" key (the grader's own reason, not quoted in the feedback) is not the
    # kernel's to send.
    results = _named(data["results"])
    own = _named(data["own"]) if isinstance(data.get("own"), list) else {}
    for name, result in own.items():
        if name in results:
            results[name]["own"] = result
    return data.get("question"), data.get("nonce"), results


def _named(rows):
    return {r["name"]: {k: r[k] for k in ("value", "error", "run_failed") if k in r} for r in rows
            if isinstance(r, dict) and isinstance(r.get("name"), str) and ("value" in r or "error" in r)}


def answer_sources(graded):
    """{question: the source of every answer cell that runs before its probe}: the question's own answer cells
    and the earlier ones, whose definitions it may call (a shortcut hidden in another question's cell)."""
    sources, ran = {}, ""
    for cell in graded.cells:
        if cell.metadata.get("dp_course_kind") == "answer":
            ran += as_scanned(cell.source) + "\n"
            for question in answer_questions(cell):
                sources[question] = ran
    return sources
