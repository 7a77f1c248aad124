"""Judges and structure rules for probes, run in the grader's process on the plain (JSON) values.

A probe's value is raw data; most are judged by equality with the solution's value for the same secret seed.
Where the lab allows more than one right structure (how many broadcasts, which rank sends which chunk, how
long a call took), the value carries raw rows and a rule judges them:

    judged(*rules, skip=("ledger",))   compare everything but the skipped keys with the solution's value, then
                                       apply each rule(expected, actual) -> "" or what is wrong

Ledger rows are [op, payload_bytes, ...] as helpers.grading.run.probe_runtime.records() returns them, one list
per rank. Messages say what is wrong and what the lab asks; they never quote the solution's value.
"""
from helpers.grading.judge.plain import compare

P2P = ("send", "recv")


def _without(value, skip):
    """value with every dict key in skip removed, at any depth."""
    if isinstance(value, dict) and "__tensor__" not in value:
        return {k: _without(v, skip) for k, v in value.items() if k not in skip}
    if isinstance(value, list):
        return [_without(v, skip) for v in value]
    return value


def judged(*rules, skip=("ledger",), rtol=1e-5, atol=1e-6):
    """A judge: the value without `skip` equals the solution's, and every rule passes."""
    def judge(expected, actual, seed):
        ok, message = compare(_without(expected, skip), _without(actual, skip), rtol, atol)
        for rule in rules:  # a rule's message says more than "wrong value": it comes first
            try:
                why = rule(expected, actual)
            except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
                why = "" if not ok else "the value has another shape than the lab asks for"
            if why:
                return False, why
        return ok, message
    return judge


def per_rank(value, key="ledger"):
    """[rows of rank 0, rows of rank 1, ...] from a list of per-rank dicts."""
    return [rank[key] for rank in value]


def ops_only(allowed, what, key="ledger"):
    """Rule: every rank issued only the ops in `allowed`."""
    def rule(expected, actual):
        for rank, rows in enumerate(per_rank(actual, key)):
            others = sorted({row[0] for row in rows} - set(allowed))
            if others:
                return f"rank {rank} issued {', '.join(others)}; {what}"
        return ""
    return rule


def point_to_point(name):
    """Rule: a ring is built from send/recv (isend/irecv) only."""
    return ops_only(P2P, f"build {name} from point-to-point messages only (dist.isend / dist.irecv)")


def _sent(rows):
    return sum(row[1] for row in rows if row[0] == "send")


def ring_bytes(label):
    """Rule: the ranks sent exactly the solution's bytes in total, each within 1 % of an equal share.

    The solution's total is N x 2(N-1)/N S for an all-reduce, (N-1)/N S for a reduce-scatter or an all-gather:
    a ring on torch.tensor_split chunks, no padding. An unchunked ring sends (N-1) S per rank."""
    def rule(expected, actual):
        total = sum(_sent(rows) for rows in per_rank(expected))
        sent = [_sent(rows) for rows in per_rank(actual)]
        share = total / len(sent)
        for rank, got in enumerate(sent):
            if abs(got - share) > 0.01 * share:
                return (f"rank {rank} sent {got / share:.2f} times a ring {label}'s bytes per rank "
                        f"({'2(N-1)/N' if label == 'all-reduce' else '(N-1)/N'} of the tensor): send one chunk of "
                        "about S/N per step")
        if sum(sent) != total:
            return f"the ranks sent {sum(sent) - total:+d} bytes more than a ring {label} on tensor_split chunks"
        return ""
    return rule


def rows_equal(op, what, key="ledger"):
    """Rule: every rank's rows of `op` equal the solution's (how many calls, how many bytes each)."""
    def rule(expected, actual):
        for rank, (mine, theirs) in enumerate(zip(per_rank(actual, key), per_rank(expected, key))):
            got, want = [r[:2] for r in mine if r[0] == op], [r[:2] for r in theirs if r[0] == op]
            if got != want:
                return (f"rank {rank} issued {len(got)} {op} call(s) of {sorted({r[1] for r in got})} bytes; "
                        f"{what}")
        return ""
    return rule


def at_most(key, limit, what):
    """Rule: the number under `key` (in every per-rank dict that has it) is below limit: a time, raw."""
    def rule(expected, actual):
        for rank, value in enumerate(actual):
            if isinstance(value, dict) and key in value and not value[key] < limit:
                return f"rank {rank}: {what} ({value[key]:.2f} s)"
        return ""
    return rule


def diagnosed(diagnose, *, rtol=1e-5, atol=1e-6, skip=()):
    """A judge: the value equals the solution's (what is scored); one that does not is diagnosed by the public
    check's own rule, diagnose(expected, actual, seed) -> the mistake and its fix or None, so the feedback names the
    mistake the check names. The rule reads the solution's value only for the inputs (the calls' arguments)."""
    def judge(expected, actual, seed):
        ok, message = compare(_without(expected, skip), _without(actual, skip), rtol, atol)
        if ok:
            return True, ""
        try:
            why = diagnose(expected, actual, seed)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError):
            why = None  # a value of another shape than the check's run gives: the comparison says so
        return False, why or message
    return judge


def _failure(check, actual, seed):
    """The first line of the check's AssertionError on the value, or None when every assertion holds."""
    from helpers.grading.judge.plain import from_plain

    try:
        check(from_plain(actual), seed)
    except AssertionError as exc:
        return (str(exc).strip().splitlines() or ["failed"])[0]
    return None


def checked(check):
    """A judge by the public check's own assertions: check(value, seed) raises the check's AssertionError (the
    mistake, its fix) or returns; the value is what the check's rank function returned on the secret inputs. Only
    for checks whose references the grader computes from the seed (not a run on the student's ranks, which the
    student controls): a value memorised for another seed fails them. The feedback is the message's first line."""
    def judge(expected, actual, seed):
        why = _failure(check, actual, seed)
        return (False, why) if why else (True, "")
    return judge


def equal_and_checked(check, rtol=1e-5, atol=1e-6, skip=()):
    """A judge: the value without `skip` equals the solution's for the same seed (the score: a check's run may hold
    references computed on the student's ranks, torch DDP's say), and a value that does not is diagnosed by the
    check's own assertions (checked)."""
    return diagnosed(lambda expected, actual, seed: _failure(check, actual, seed), rtol=rtol, atol=atol, skip=skip)


def _rows_as_tuples(value):
    """JSON's lists back to the tuples a check compares with: a ledger row ["all_gather", 48] is ("all_gather", 48)."""
    if isinstance(value, dict):
        return {k: _rows_as_tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and isinstance(value[0], str) and all(isinstance(v, (int, float)) for v in value[1:]) \
                and len(value) > 1:
            return tuple(value)
        return [_rows_as_tuples(v) for v in value]
    return value


def by_public_checks(question, results, offset, names=(), skip=(), rtol=1e-5, atol=1e-6, convert=None):
    """A judge by the question's public checks themselves, run in the grader on the value: results = (module, name) of
    the function the checks get their ranks' results from, answered by the value while they run; offset = (module,
    modulo): the check module's OFFSET, set from the question's seed so that the checks' references are the probe's
    inputs'. The value passes when no check fails and, without `skip` (what differs between two right answers: ids,
    a message's words), it equals the solution's (the checks may compare with references computed on the student's
    ranks, which the student controls). The first check that fails says the feedback's line, as check()'s first
    failed line does. The ranks' tuples come back as tuples where the rank kept them (probe_runtime.keep_tuples),
    ledger rows otherwise; convert(value) rebuilds what JSON changed further (int keys)."""
    from helpers.grading.judge.plain import from_plain
    from helpers.grading.judge.replay import first_line
    from helpers.grading.run.probe_runtime import restore_tuples

    module, name = results
    common, modulo = offset

    def first_failure(actual, seed):
        value = _rows_as_tuples(restore_tuples(from_plain(actual)))
        value = convert(value) if convert else value
        original, original_offset = getattr(module, name), common.OFFSET
        setattr(module, name, lambda *args, **kwargs: value)
        common.OFFSET = seed % modulo
        try:
            return first_line(question, lambda check: check({n: None for n in names}))
        finally:
            setattr(module, name, original)
            common.OFFSET = original_offset

    def judge(expected, actual, seed):
        why = first_failure(actual, seed)
        if why:
            return False, why
        return compare(_without(expected, skip), _without(actual, skip), rtol, atol)
    return judge


def tensors_only(value):
    """The tensors of a plain value, in their places (numbers and text dropped): what must equal the solution's where
    the structure around them may rightly differ (a ring's own order of messages: its rows, its bytes per rank)."""
    if isinstance(value, dict) and "__tensor__" in value:
        return value
    if isinstance(value, dict):
        kept = {k: tensors_only(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, [], {})}
    if isinstance(value, list):
        kept = [tensors_only(v) for v in value]
        return [v for v in kept if v not in (None, [], {})]
    return None


def replayed(question, common, modulo, names, *, project=None, rtol=1e-5, atol=1e-6, convert=None, record=None,
             given=None):
    """A judge by the question's public checks, replayed in the grader on the record the probe made in the kernel
    (helpers/grading/judge/replay.py): the value passes when no check fails on it and project(value) equals the
    solution's
    (default: the whole record). common: the check module holding OFFSET (its name), set to seed % modulo;
    record: the key of the record in the value (None: the value is the record); given(): the released lab's
    definitions the checks use (replay.first_failure)."""
    from helpers.grading.judge import replay

    def judge(expected, actual, seed):
        why = replay.first_failure(question, actual[record] if record else actual, common, seed % modulo, names,
                                   convert, given() if given else None)
        if why:
            return False, why
        if isinstance(actual, dict) and "failed" in actual:  # the scored run raised; its record named nothing
            return False, f"the run raised {actual['failed']}: run the public check to see where"
        see = project or (lambda value: value)
        return compare(see(expected), see(actual), rtol, atol)
    return judge
