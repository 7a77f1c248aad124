"""Which students handed in the same answer: winnowed token fingerprints of each question's answer region.

The grader scores each submission alone; two students with one answer, renamed and reformatted, both score. This
module compares every pair of a class's answers to one question, as MOSS does (Schleimer, Wilkerson and Aiken,
"Winnowing: local algorithms for document fingerprinting", SIGMOD 2003), on the part each student wrote:

| step | what it does, and why |
|---|---|
| answer | the submission's answer cells of the question, found as the grader finds them (assemble.find_answer): |
|        | edits elsewhere in the notebook do not count |
| tokens | Python's `tokenize`; comments, blank lines, line breaks and indentation dropped, `;` = end of line: |
|        | reformatting changes nothing |
| names | `V` for a name the answer binds (variable, argument, loop target, inner function, import alias) and for |
|       | a name the released lab never uses; attributes (`.grad`), keyword arguments, builtins and the lab's own |
|       | names (`torch`, `dist`, the function's parameters) stay: renaming changes nothing, yet `dist.all_reduce` |
|       | and `dist.broadcast` still differ |
| literals | every string is `S` (docstrings, messages); numbers stay |
| given | runs of at least K tokens equal to runs of the released cells (the starter: signature, docstring, the |
|       | TODO's `raise`) are removed, and every K-gram of the released cells is dropped: never evidence |
| fingerprints | a hash of every K consecutive tokens; winnowing keeps the smallest of each WINDOW consecutive ones, |
|              | so any shared run of K + WINDOW - 1 tokens is found, whatever the statement order around it |
| common | a fingerprint in the answers of more than max(COMMON_MIN, COMMON_SHARE x the class) students is |
|        | dropped: the idiom most students write flags no one |
| short | an answer under MIN_TOKENS tokens is not compared: a one-line fix everyone finds alike is expected |
| score | tokens inside shared fingerprints, in both answers / tokens of both answers; pairs from FLAG are |
|       | listed. 1.0: the same answer with nothing common in it; one answer inside a longer one scores lower |
| identical | whole submissions: the same file byte for byte, or the same tokens in every answer (the table's |
|           | normalisation), listed as such whatever the common filter says (`identical`) |
| solution | every answer is also scored against the published solution's (solutions/NN's answer cells, which the |
|          | grader keeps in a release), without the common filter: a class pasting it is listed (`against_solution`) |
| cost | an answer is read up to MAX_ANSWER_CHARS characters (a hostile one of megabytes: ~0.2 CPU-s a question), |
|      | a notebook's code cells by json.loads up to submissions.MAX_BYTES (50 MiB of cells: ~2 CPU-s) |

The hash is blake2b, not Python's `hash()` (salted per process), so a class scores the same on every run.
What it cannot see: an answer copied and then rewritten by hand, statement by statement; a wrong idea shared in
conversation; copying from outside the class. A listed pair is evidence for a person to read, not a verdict.
"""
import ast
import builtins
import dataclasses
import functools
import hashlib
import io
import itertools
import json
import keyword
import statistics
import tokenize
import warnings

import nbformat

from helpers.grading.prepare.assemble import answer_questions, find_answer
from helpers.grading.prepare.submissions import Refused, SubmissionError, read_bytes, read_notebook, scrub

K = 5               # tokens in a fingerprint: `dist . all_reduce ( V` is one
WINDOW = 4          # winnowing window: shared runs of K + WINDOW - 1 = 8 tokens are always found
MIN_TOKENS = 20     # shorter answers are not compared: `return a + b` is 5 tokens, lab 3.2's loop about 30
COMMON_SHARE = 0.1  # a fingerprint in more than this share of the class's answers (and more than COMMON_MIN) is common
COMMON_MIN = 3      # ... so in a small class a group of three who share an answer still shows
FLAG = 0.5          # pairs scoring at least this are listed
# An answer is compared on its first MAX_ANSWER_CHARS characters: the longest of the course's solutions is 6,297
# (lab 10.3), and each character costs about 4 CPU-us to tokenise, fingerprint and compare (an answer of 120,000
# characters, two students: 0.9 CPU-s), so a hostile answer of megabytes costs at most ~0.2 CPU-s a question.
MAX_ANSWER_CHARS = 50_000

_NEWLINE = ";"
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
_BUILTINS = frozenset(dir(builtins))


@dataclasses.dataclass(frozen=True)
class Answer:
    """One student's answer to one question: its source and the normalised tokens they wrote, with their lines."""

    student: str
    question: str
    source: str
    tokens: tuple  # normalised, starter removed
    lines: tuple   # line in source (from 1) of each token

    def region(self):
        """(first line, last line) of source that holds the student's own tokens."""
        return (min(self.lines), max(self.lines)) if self.lines else (0, 0)


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two answers to one question and how much of them their shared fingerprints cover."""

    question: str
    a: Answer
    b: Answer
    covered_a: frozenset  # token positions of a inside a shared fingerprint
    covered_b: frozenset
    shared: int           # fingerprints shared

    @property
    def score(self):
        return (len(self.covered_a) + len(self.covered_b)) / (len(self.a.tokens) + len(self.b.tokens))


@functools.lru_cache(maxsize=256)  # the released cells, tokenised again for every student
def _raw_tokens(source):
    """((type, text, line), ...) of source, magic lines (%%ranks, !pip) blanked; what comes before a tokenize error."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")]
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            found.append((tok.type, tok.string, tok.start[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # unbalanced brackets or an open string at the end: the tokens before it still count
    return tuple(found)


@functools.lru_cache(maxsize=256)
def bound_names(source):
    """Names source binds by assignment, argument, loop, def/class or import: what a copier can rename."""
    try:
        tree = ast.parse("\n".join("" if x.lstrip().startswith(("%", "!")) else x for x in source.split("\n")))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a hostile nesting must not end the report
        return frozenset()  # cannot tell; the rule for names the lab never uses still renames the new ones
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return frozenset(bound)


def normalise(source, renamed, vocabulary):
    """[(token, line)]: source's tokens, normalised as the module's table says.

    renamed: names that become V; vocabulary: the released lab's names, which stay unless renamed."""
    raw = [t for t in _raw_tokens(source) if t[0] not in _SKIP]
    out, depth = [], 0
    for i, (kind, text, line) in enumerate(raw):
        before = raw[i - 1][1] if i else ""
        after = raw[i + 1][1] if i + 1 < len(raw) else ""
        if kind == tokenize.OP:
            depth += text in "([{"
            depth -= text in ")]}"
            out.append((_NEWLINE if text == ";" else text, line))
        elif kind == tokenize.NEWLINE:
            out.append((_NEWLINE, line))
        elif kind == tokenize.STRING:
            out.append(("S", line))
        elif kind == tokenize.NAME and not keyword.iskeyword(text) and before != ".":
            keyword_argument = depth > 0 and after == "=" and text not in renamed
            kept = keyword_argument or (text not in renamed and (text in vocabulary or text in _BUILTINS))
            out.append((text if kept else "V", line))
        else:
            out.append((text, line))
    return out


def given_positions(released_tokens, student_tokens):
    """Positions of student_tokens inside a run of at least K tokens equal to a run of the released cell's.

    Every such run is made of K-grams of the released cell, so a set of them finds it in one pass, linear in the
    answer: difflib's alignment here cost (a token's count in the starter) x (answer tokens) per block it found, 2.5
    CPU-s for a class of 2 whose answer repeated the starter's most common token (test_similarity)."""
    grams = {tuple(released_tokens[i:i + K]) for i in range(len(released_tokens) - K + 1)}
    given = set()
    for j in range(len(student_tokens) - K + 1):
        if tuple(student_tokens[j:j + K]) in grams:
            given.update(range(j, j + K))
    return given


def student_answer(student, question, source, released_source, vocabulary):
    """The Answer of one student's source to a question whose released cell(s) held released_source."""
    renamed = bound_names(source) - bound_names(released_source)
    mine = normalise(source, renamed, vocabulary)
    given = given_positions([t for t, _ in normalise(released_source, renamed, vocabulary)], [t for t, _ in mine])
    kept = [(t, line) for j, (t, line) in enumerate(mine) if j not in given]
    return Answer(student, question, source, tuple(t for t, _ in kept), tuple(line for _, line in kept))


def _hash(gram):
    return int.from_bytes(hashlib.blake2b(" ".join(gram).encode(), digest_size=8).digest(), "big")


def kgram_hashes(tokens):
    """[hash of tokens[i:i + K]] for every i."""
    return [_hash(tokens[i:i + K]) for i in range(len(tokens) - K + 1)]


def winnow(hashes):
    """{hash: [positions]} chosen by robust winnowing: the smallest of each WINDOW hashes (the rightmost on ties)."""
    if not hashes:
        return {}
    chosen, last = {}, None
    for start in range(max(1, len(hashes) - WINDOW + 1)):
        window = hashes[start:start + WINDOW]
        low = min(window)
        position = start + max(i for i, h in enumerate(window) if h == low)
        if position != last:
            chosen.setdefault(low, []).append(position)
            last = position
    return chosen


def fingerprints(answer, starter):
    """{hash: [positions]} of an answer, less every K-gram of the starter code (a set of hashes)."""
    return {h: p for h, p in winnow(kgram_hashes(answer.tokens)).items() if h not in starter}


def compare(answers, starter=frozenset()):
    """(pairs from FLAG up, best first; {(student, student): score} of every pair sharing a fingerprint, the others
    scoring 0; {common hash}) of one question's answers."""
    long_enough = [a for a in answers if len(a.tokens) >= MIN_TOKENS]
    prints = {a.student: fingerprints(a, starter) for a in long_enough}
    holders = {}
    for student, found in prints.items():
        for h in found:
            holders.setdefault(h, []).append(student)
    limit = max(COMMON_MIN, COMMON_SHARE * len(long_enough))
    common = {h for h, students in holders.items() if len(students) > limit}
    shared = {}  # only pairs that share a fingerprint: a class of 200 has 19,900 pairs, most sharing none
    for h, students in holders.items():
        if h not in common:
            for pair in itertools.combinations(sorted(students), 2):
                shared.setdefault(pair, set()).add(h)
    by_student = {a.student: a for a in long_enough}
    pairs, scores = [], {}
    for (a, b), hashes in shared.items():
        pair = Pair(by_student[a].question, by_student[a], by_student[b], _covered(prints[a], hashes),
                    _covered(prints[b], hashes), len(hashes))
        scores[a, b] = pair.score
        if pair.score >= FLAG:
            pairs.append(pair)
    pairs.sort(key=lambda p: (-p.score, -len(p.covered_a) - len(p.covered_b), p.a.student, p.b.student))
    return pairs, scores, common


def _covered(found, shared):
    return frozenset(i for h in shared for start in found[h] for i in range(start, start + K))


def median(scores, answers):
    """The median score of all pairs of `answers` answers, from compare's {pair: score} of those above 0."""
    total = answers * (answers - 1) // 2
    if total == 0:
        return 0.0
    return statistics.median([*scores.values(), *[0.0] * (total - len(scores))])


def against_solution(answers, solution, starter=frozenset()):
    """[Pair(question, the student's answer, the solution's)] scoring from FLAG up, best first. The class's common
    fingerprints count here: a class that pastes the published solution is listed, every one of them."""
    if solution is None or len(solution.tokens) < MIN_TOKENS:
        return []
    theirs = fingerprints(solution, starter)
    pairs = []
    for answer in answers:
        if len(answer.tokens) < MIN_TOKENS:
            continue
        mine = fingerprints(answer, starter)
        shared = set(mine) & set(theirs)
        if answer.tokens == solution.tokens:  # every token, not only those winnowing kept a fingerprint around
            every = frozenset(range(len(answer.tokens)))
            pair = Pair(answer.question, answer, solution, every, every, len(shared))
        else:
            pair = Pair(answer.question, answer, solution, _covered(mine, shared), _covered(theirs, shared),
                        len(shared))
        if pair.score >= FLAG or answer.tokens == solution.tokens:
            pairs.append(pair)
    pairs.sort(key=lambda p: (p.a.tokens != p.b.tokens, -p.score, p.a.student))
    return pairs


@dataclasses.dataclass(frozen=True)
class Identical:
    """Students who handed in the same submission: `how` is "file" (byte for byte) or "answers" (the same tokens in
    every answer, after the module's normalisation)."""

    how: str
    students: tuple  # in name order
    tokens: int      # the students' own tokens, every answer together
    solution: tuple  # questions whose answer is the published solution's, token for token


def identical(found):
    """[Identical] of a class (ClassAnswers): byte-identical files first, then the same answers; largest first.

    A group whose answers hold no token of the students' own (the released lab handed in as it was) is not listed;
    nor are answers alike under MIN_TOKENS in all, a group of answers that is also one of files."""
    own, keys = {}, {}
    for question, answers in found.answers.items():
        for a in answers:
            own[a.student] = own.get(a.student, 0) + len(a.tokens)
            keys.setdefault(a.student, {})[question] = a.tokens
    groups = []
    by_file = _groups(found.digests)
    for students in by_file:
        if own.get(students[0], 0) > 0:
            groups.append(Identical("file", students, own[students[0]], _solution_questions(found, students[0])))
    by_answers = _groups({s: tuple(sorted(k.items())) for s, k in keys.items() if own[s] >= MIN_TOKENS})
    for students in by_answers:
        if students not in by_file:
            groups.append(Identical("answers", students, own[students[0]], _solution_questions(found, students[0])))
    return groups


def _groups(keys):
    """[(student, ...)] of the students sharing a key, two or more, largest group first."""
    by_key = {}
    for student, key in sorted(keys.items()):
        by_key.setdefault(key, []).append(student)
    return sorted((tuple(g) for g in by_key.values() if len(g) > 1), key=lambda g: (-len(g), g))


def _solution_questions(found, student):
    """The questions whose answer of student is the solution's, token for token (and not empty)."""
    return tuple(q for q, answers in found.answers.items() for a in answers if a.student == student
                 and q in found.solution and a.tokens and a.tokens == found.solution[q].tokens)


@dataclasses.dataclass
class ClassAnswers:
    """Every answer of a class to every question of a lab, and what could not be read."""

    answers: dict     # {question: [Answer]}
    starters: dict    # {question: frozenset of the released cells' K-gram hashes}
    unread: dict      # {student: why}
    missing: dict     # {question: [student]} no answer cell found
    digests: dict = dataclasses.field(default_factory=dict)   # {student: sha256 of the file}
    solution: dict = dataclasses.field(default_factory=dict)  # {question: the published solution's Answer}
    cut: dict = dataclasses.field(default_factory=dict)       # {(student, question): characters, over the cap}


def _released_sources(released):
    """{question: the released cells' source}, and the released lab's names (every code cell's)."""
    sources, vocabulary = {}, set()
    for cell in released.cells:
        if cell.cell_type != "code":
            continue
        vocabulary |= {text for kind, text, _ in _raw_tokens(cell.source) if kind == tokenize.NAME}
        for question in answer_questions(cell):
            sources[question] = sources.get(question, "") + cell.source + "\n"
    return sources, vocabulary


def _answer_source(released, submission, question):
    """The submission's answer cells of question, joined; None when none is found."""
    found = [find_answer(cell, submission) for cell in released.cells if question in answer_questions(cell)]
    return None if any(f is None for f in found) else "\n".join(found) + "\n"


def _code_cells(data, path):
    """The notebook of data with only its code cells' ids and sources: json.loads, not nbformat's validation (a
    notebook of 48 MB: 0.8 CPU-s instead of 5). Anything but a v4 notebook is read by read_notebook (its messages)."""
    try:
        raw = json.loads(data)
        # NotebookNodes made here, not by nbformat.v4.new_code_cell: it validates each cell (100,000 cells: 40 s).
        cells = [nbformat.NotebookNode(cell_type="code", id=c.get("id") if isinstance(c.get("id"), str) else None,
                                       source=c["source"] if isinstance(c["source"], str) else "".join(c["source"]))
                 for c in raw["cells"] if c.get("cell_type") == "code"]
        if raw.get("nbformat") == 4:
            return nbformat.NotebookNode(cells=cells)
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    with warnings.catch_warnings():  # nbformat's validation notes (duplicate cell ids): the grader's to say
        warnings.simplefilter("ignore")
        return read_notebook(path)


def _answers(student, found, sources, vocabulary, result):
    """{question: Answer} of one student's answers {question: source or None}; notes the missing and the cut."""
    answers = {}
    for question, source in found.items():
        if source is None:
            result.missing[question].append(student)
            continue
        if len(source) > MAX_ANSWER_CHARS:
            result.cut[student, question] = len(source)
            source = source[:MAX_ANSWER_CHARS]
        answers[question] = student_answer(student, question, source, sources[question], vocabulary)
    return answers


def read_class(released, paths, solution=None):
    """ClassAnswers of the submissions {student: path, or submissions.Refused: not read} to the released lab (an
    nbformat notebook); solution: the published solution's notebook (its answers are scored against every
    student's), if given."""
    sources, vocabulary = _released_sources(released)
    result = ClassAnswers({q: [] for q in sources}, {}, {}, {q: [] for q in sources})
    for question, source in sources.items():
        tokens = [t for t, _ in normalise(source, set(), vocabulary)]
        result.starters[question] = frozenset(kgram_hashes(tokens))
        own = _answer_source(released, solution, question) if solution is not None else None
        if own is not None:
            result.solution[question] = student_answer("(solution)", question, own, source, vocabulary)
    for student, path in sorted(paths.items()):
        if isinstance(path, Refused):  # never opened (submissions.listing)
            result.unread[student] = path.why
            continue
        try:
            data = read_bytes(path)  # a regular file only, capped (submissions.py)
            result.digests[student] = hashlib.sha256(data).hexdigest()
            submission = scrub(_code_cells(data, path))
            found = {q: _answer_source(released, submission, q) for q in sources}
        except SubmissionError as exc:  # its message quotes nothing of the file
            result.unread[student] = str(exc)
            continue
        except Exception as exc:  # an unreadable file is that student's note, never the class's end
            result.unread[student] = f"not a readable notebook ({type(exc).__name__})"
            continue
        try:  # one student's answers never cost the class its report (issue 29)
            answers = _answers(student, found, sources, vocabulary, result)
        except Exception as exc:  # noqa: BLE001 - named among those not compared
            result.unread[student] = f"not compared: reading the answers raised {type(exc).__name__}"
            continue
        for question, answer in answers.items():
            result.answers[question].append(answer)
    return result
