"""The mistake catalogue: per lab, the wrong answers students most likely write, and the feedback each must get.

One module per lab (labNN.py) holds SOLUTION (the solution notebook) and MISTAKES, a list of Mistake: the
question, a name, the wrong definition(s) as source (they replace the solution's) or as a dict {name: object}, and
the words the FIRST line of check()'s report must contain: the mistake and its fix; optionally (mentions) details the
rest of the report must give. tests/test_mistakes.py drives every one through check().
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
