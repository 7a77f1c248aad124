"""The mistake catalogue: per lab, the wrong answers students most likely write, and the feedback each must get.

One module per lab (labNN.py) holds SOLUTION (the solution notebook) and MISTAKES, a list of Mistake: the
question, a name, the wrong definition(s) as source (they replace the solution's) or as a dict {name: object}, and
the words the FIRST line of check()'s report must contain: the mistake and its fix; optionally (mentions) details the
rest of the report must give. tests/test_mistakes.py drives every one through check(), and through the hidden tests
of its question (the probes, judged by the grader): only that question loses points, and its feedback names the same
mistake (first_line, or `hidden`) without a value of the right answer.
Sources: the chapter's own naive versions, the common errors in the course's notes, and what trying showed.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Mistake:
    question: str
    name: str
    override: object  # source that redefines answers, or {name: object}
    first_line: tuple  # fragments the first line of the report must contain, e.g. ("SUM", "divide")
    run_fails: bool = False  # the ranks' run itself fails (a hang, a crash): its report must be printed once
    mentions: tuple = ()  # fragments the whole report must also contain: the details after the first line
    # Fragments the hidden tests' feedback must say instead of first_line, where the public check's first line holds
    # a detail of its own inputs (a count of calls on its model); None: first_line
    hidden: tuple = None
