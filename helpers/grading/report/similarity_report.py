"""OUT/similarity.md and OUT/similarity.csv: pairs of students whose answers to a question are unusually alike.

Written by `make grade` beside grades.csv, from the submissions and the published solution alone (nothing is
executed); how pairs are found and scored is helpers/grading/report/similarity.py's docstring. similarity.md lists, in
this
order: identical submissions, copies of the published solution, then pairs of alike answers. similarity.csv has one
row per pair, in the same order:

| column | meaning |
|---|---|
| kind | `identical_file` (byte for byte), `identical_answers` (every answer, normalised), `solution` (an answer |
|      | and the published solution's: student_b is empty), `alike` (two answers to one question) |
| question | e.g. 3.3; `all` for identical submissions |
| student_a, student_b | the pair, in name order (every pair of a group of identical submissions) |
| score | tokens inside shared fingerprints, both answers, / tokens of both answers (0-1); 1 for identical ones |
| a_matched, a_tokens, b_matched, b_tokens | each answer's tokens inside shared fingerprints, and its length |
| fingerprints | fingerprints the two share (common ones excluded but against the solution) |
"""
import itertools
import pathlib

import nbformat

from helpers.grading.report import similarity
from helpers.grading.report.report import question_order
from helpers.grading.report.spreadsheet import write_csv

SHOWN = 10  # pairs whose answers the report prints in full

HEADER = """# Similar answers: lab {lab}

**Evidence for a person to read, not a verdict.** Three lists, strongest first: submissions that are identical (the
same file, or the same code in every answer); answers that are copies of the published solution (this course's
`solutions/` is public); and pairs of students whose answers to one question share more of their code than the
rest of the class does, after removing what everyone was given (the released lab's code in the answer cell) and
what copying changes (comments, blank lines, spacing, line breaks, variable names, strings). Read the answers
before concluding anything: students who worked through the same chapter cell, a tutorial or office hours
together write alike too, and a short answer has few ways to be right.

How short and common answers are handled: an answer under {min_tokens} tokens (a one-line fix) is not compared, and
a fingerprint ({k} consecutive tokens) found in the answers of more than {common} of the class's students (and of
more than {common_min}) is taken as the common solution and ignored in the pairs (not in the two lists before them),
so the answer most students find pairs no one. A pair is listed from a score of {flag:.2f}: the share of both
answers' tokens inside fingerprints they share (1.00: the same answer token for token, with nothing in it the class
has in common; one answer inside a much longer one scores lower). The median pair score of each question, below, is
the class's baseline. What this cannot see: an answer copied and then rewritten by hand, a wrong idea shared in
conversation, copying from outside the class but the published solution. An answer is read up to its first
{max_chars:,} characters, several times the longest solution's: what a longer one holds beyond is not compared, and
the answer is named below.
"""


def write(out, lab, released, paths, solution=None):
    """Write OUT/similarity.md and .csv for the submissions {student: path}; return the listed pairs of alike answers.

    solution: the published solution's notebook, or its path (every answer is also scored against it)."""
    if isinstance(solution, (str, pathlib.Path)):
        solution = nbformat.read(solution, as_version=4)
    found = similarity.read_class(released, paths, solution)
    questions = question_order(found.answers)
    results = {q: similarity.compare(found.answers[q], found.starters[q]) for q in questions}
    pairs = sorted((p for q in questions for p in results[q][0]), key=lambda p: -p.score)
    same = similarity.identical(found)
    copies = {q: similarity.against_solution(found.answers[q], found.solution.get(q), found.starters[q])
              for q in questions}
    out = pathlib.Path(out)
    _write_csv(out / "similarity.csv", pairs, same, [p for q in questions for p in copies[q]])
    students = len(paths) - len(found.unread)
    text = HEADER.format(lab=lab, min_tokens=similarity.MIN_TOKENS, k=similarity.K, flag=similarity.FLAG,
                         common=f"{similarity.COMMON_SHARE:.0%}", common_min=similarity.COMMON_MIN,
                         max_chars=similarity.MAX_ANSWER_CHARS)
    text += _summary(questions, found, results, students, copies)
    text += _identical(same) + _solution_copies(questions, found, copies)
    text += _pairs_table(pairs) + _repeat_offenders(pairs) + _shown(pairs[:SHOWN]) + _not_compared(found)
    (out / "similarity.md").write_text(text, encoding="utf-8", errors="replace")
    return pairs


def _write_csv(path, pairs, same=(), copies=()):
    rows = [["kind", "question", "student_a", "student_b", "score", "a_matched", "a_tokens", "b_matched", "b_tokens",
             "fingerprints"]]
    for group in same:
        rows += [[f"identical_{group.how}", "all", a, b, "1.00", group.tokens, group.tokens, group.tokens,
                  group.tokens, ""] for a, b in itertools.combinations(group.students, 2)]
    rows += [["solution", p.question, p.a.student, "", f"{p.score:.2f}", len(p.covered_a), len(p.a.tokens),
              len(p.covered_b), len(p.b.tokens), p.shared] for p in copies]
    rows += [["alike", p.question, p.a.student, p.b.student, f"{p.score:.2f}", len(p.covered_a), len(p.a.tokens),
              len(p.covered_b), len(p.b.tokens), p.shared] for p in pairs]
    write_csv(path, rows)


def _summary(questions, found, results, students, copies):
    lines = [f"\n{students} submission(s) read.\n",
             "| question | answers | compared (long enough) | median pair score | common fingerprints | pairs listed "
             "| close to the solution |",
             "|---|---|---|---|---|---|---|"]
    for q in questions:
        pairs, scores, common = results[q]
        long_enough = sum(len(a.tokens) >= similarity.MIN_TOKENS for a in found.answers[q])
        middle = similarity.median(scores, long_enough)
        close = len(copies[q]) if q in found.solution else "-"
        lines.append(f"| {q} | {len(found.answers[q])} | {long_enough} | {middle:.2f} | {len(common)} | {len(pairs)} "
                     f"| {close} |")
    return "\n".join(lines) + "\n"


_HOW = {"file": "the same file, byte for byte", "answers": "the same code in every answer (spacing, comments, names "
        "and strings aside)"}


def _identical(groups):
    head = "\n## Identical submissions\n\n"
    if not groups:
        return head + "No two submissions are identical (the released lab handed in untouched does not count).\n"
    lines = [head + "Listed whatever the class has in common: two students handing in one file did not write it "
             "twice.\n", "| # | students | identical | own tokens | the published solution's in |",
             "|---|---|---|---|---|"]
    for rank, g in enumerate(groups, start=1):
        lines.append(f"| {rank} | {', '.join(g.students)} | {_HOW[g.how]} | {g.tokens} | "
                     f"{', '.join(g.solution) or '-'} |")
    return "\n".join(lines) + "\n"


def _solution_copies(questions, found, copies):
    head = "\n## Copies of the published solution\n\n"
    if not found.solution:
        return head + "Not compared: no published solution was given.\n"
    listed = [p for q in questions for p in copies[q]]
    if not listed:
        return head + (f"No answer scored {similarity.FLAG:.2f} or more against the published solution's "
                       "(solutions/, whose answers are public with the course).\n")
    lines = [head + "Each answer against the published solution's (this course's `solutions/` is public), the class's "
             "common code included: here a class that pastes it is listed, every one of them. A short answer has few "
             "ways to be right: compare a score with the question's row above.\n",
             "| question | student | score | identical | student matched / tokens | solution matched / tokens |",
             "|---|---|---|---|---|---|"]
    for p in listed:
        same = "yes" if p.a.tokens == p.b.tokens else ""
        lines.append(f"| {p.question} | {p.a.student} | {p.score:.2f} | {same} | {len(p.covered_a)} / "
                     f"{len(p.a.tokens)} | {len(p.covered_b)} / {len(p.b.tokens)} |")
    return "\n".join(lines) + "\n"


def _pairs_table(pairs):
    if not pairs:
        return (f"\n## Pairs\n\nNo pair of answers reached the listing score ({similarity.FLAG:.2f}) in any question: "
                "nothing here suggests copying.\n")
    lines = ["\n## Pairs, most alike first\n", "| # | question | student A | student B | score | A matched / tokens "
             "| B matched / tokens |", "|---|---|---|---|---|---|---|"]
    for rank, p in enumerate(pairs, start=1):
        lines.append(f"| {rank} | {p.question} | {p.a.student} | {p.b.student} | {p.score:.2f} | "
                     f"{len(p.covered_a)} / {len(p.a.tokens)} | {len(p.covered_b)} / {len(p.b.tokens)} |")
    return "\n".join(lines) + "\n"


def _repeat_offenders(pairs):
    """Students listed together in more than one question: stronger evidence than one alike answer."""
    together = {}
    for p in pairs:
        together.setdefault((p.a.student, p.b.student), []).append(p.question)
    repeated = {k: v for k, v in together.items() if len(v) > 1}
    if not repeated:
        return ""
    lines = ["\n## Pairs listed in more than one question\n"]
    lines += [f"- {a} and {b}: {', '.join(question_order(qs))}" for (a, b), qs in sorted(repeated.items())]
    return "\n".join(lines) + "\n"


def _shown(pairs):
    if not pairs:
        return ""
    parts = [f"\n## The {len(pairs)} most alike, answer by answer\n",
             "Lines marked `>` hold tokens of a fingerprint the two answers share; line numbers are the answer "
             "cell's.\n"]
    for rank, p in enumerate(pairs, start=1):
        parts.append(f"\n### {rank}. Lab {p.question}: {p.a.student} and {p.b.student}, score {p.score:.2f}\n")
        parts += [_listing(p.a, p.covered_a), _listing(p.b, p.covered_b)]
    return "\n".join(parts)


def _listing(answer, covered):
    """The student's own lines of their answer, those inside a shared fingerprint marked."""
    first, last = answer.region()
    marked = {answer.lines[i] for i in covered}
    lines = answer.source.split("\n")
    body = [f"{'>' if n in marked else ' '} {n:3d}  {lines[n - 1]}" for n in range(first, last + 1)]
    fence = "````" if any("```" in x for x in body) else "```"
    return f"\n{answer.student}:\n\n{fence}\n" + "\n".join(body) + f"\n{fence}\n"


def _not_compared(found):
    notes = [f"- {s}: {why}" for s, why in sorted(found.unread.items())]
    notes += [f"- {s}: the answer to lab {q} is {n:,} characters; only its first {similarity.MAX_ANSWER_CHARS:,} "
              "were compared" for (s, q), n in sorted(found.cut.items())]
    notes += [f"- lab {q}: no answer cell found for {', '.join(students)}"
              for q, students in sorted(found.missing.items()) if students]
    return ("\n## Not compared\n\n" + "\n".join(notes) + "\n") if notes else ""
