"""Values as plain data (JSON), and their comparison in the grader's own process.

A probe's value leaves the student's kernel as JSON only: never a pickle, which could run code
in the grader. Tensors become {"__tensor__": dtype, "shape": [...], "data": [...]}.
"""
import math

_LIMIT = 1_000_000  # elements: a probe value larger than this is a mistake, not an answer


def to_plain(value):
    """JSON-ready copy of value: numbers, strings, None, lists, dicts with str keys, tensors."""
    import torch  # the kernel has it; the grader's comparison does not need it

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.numel() > _LIMIT:
            raise ValueError(f"a tensor of {value.numel()} elements is too large to grade")
        return {"__tensor__": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "data": value.flatten().tolist()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a {type(value).__name__} cannot be graded; return tensors, numbers, lists or dicts")


def from_plain(value):
    """The inverse of to_plain, in the grader's process: tensors back from their plain form."""
    import torch

    if isinstance(value, dict) and "__tensor__" in value:
        return torch.tensor(value["data"], dtype=getattr(torch, value["__tensor__"])).reshape(value["shape"])
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: from_plain(v) for k, v in value.items()}
    return value


def _number(x):
    return isinstance(x, (bool, int, float))


def _close(a, b, rtol, atol):
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= atol + rtol * abs(b)


def compare(expected, actual, rtol=1e-5, atol=1e-6):
    """(True, "") when actual matches expected; else (False, a message that does not reveal expected)."""
    if isinstance(expected, dict) and "__tensor__" in expected:
        if not (isinstance(actual, dict) and "__tensor__" in actual):
            return False, "expected a tensor"
        if actual.get("shape") != expected["shape"]:
            return False, f"wrong shape {tuple(actual['shape']) if isinstance(actual.get('shape'), list) else '?'}"
        # A dict spelled like a tensor reaches here from the kernel too: its data must fill its shape with numbers
        # (an empty list once passed every tensor probe, zip() comparing nothing).
        data = actual.get("data")
        if not isinstance(data, list) or len(data) != len(expected["data"]) or not all(map(_number, data)):
            return False, "not a tensor: its values do not fill its shape"
        bad = sum(not _close(float(a), float(e), rtol, atol) for a, e in zip(actual["data"], expected["data"]))
        return (True, "") if not bad else (False, f"{bad} of {len(expected['data'])} values wrong")
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return False, "wrong length or type"
        for e, a in zip(expected, actual):
            ok, message = compare(e, a, rtol, atol)
            if not ok:
                return False, message
        return True, ""
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return False, "wrong keys or type"
        return compare([expected[k] for k in sorted(expected)], [actual[k] for k in sorted(expected)], rtol, atol)
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(actual, (int, float)) and not isinstance(actual, bool) and _close(actual, expected, rtol, atol):
            return True, ""
        return False, "wrong value"
    return (True, "") if actual == expected else (False, "wrong value")
