"""A collective call as reports print it, `all_reduce(tensor=float32[4], op=SUM)`, and how ranks' calls differ.

A call is plain data, so it travels from a rank to the kernel:
    {"op": "all_reduce", "args": {"tensor": "float32[4]", "op": "SUM"}, "site": (filename, lineno, function)}
Crash reports read it from the frame of the torch.distributed function a rank is in (its arguments are that
frame's locals); collective checks (helpers.collective_check) build it from the op the backend is given.
A diagnostic tool: it reads stacks and frame locals, which is its job.
"""
import torch
import torch.distributed as dist

from helpers.hang import _TORCH_DIR, COLLECTIVES, is_user_file

# Arguments that do not change what a collective moves or computes: left out of the text.
_IGNORED = {"async_op", "timeout", "device_ids", "device"}


def tensor_text(t):
    """'float32[4, 2]': a tensor's dtype and shape."""
    return f"{str(t.dtype).removeprefix('torch.')}[{', '.join(map(str, t.shape))}]"


def _flat(value):
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat(item)]
    return [value]


def value_text(value):
    """A tensor, a list of tensors ('2 x float32[4]'), a reduce op ('SUM'), a rank or split sizes; None: not shown."""
    if isinstance(value, torch.Tensor):
        return tensor_text(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in _flat(value)):
        texts = [tensor_text(t) for t in _flat(value)]
        if len(texts) == 1:  # c10d ops take lists: all_reduce(t) arrives as [t]
            return texts[0]
        return f"{len(texts)} x {texts[0]}" if len(set(texts)) == 1 else "[" + ", ".join(texts) + "]"
    if isinstance(value, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        return reduce_op_name(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return str(list(value))
    return None


_REDUCE_OPS = {int(v): name for name, v in dist.ReduceOp.RedOpType.__members__.items()}


def reduce_op_name(op):
    """'SUM' for ReduceOp.SUM, for a ReduceOp object, or for the number a c10d ReduceOp holds."""
    if isinstance(op, int):
        return _REDUCE_OPS.get(op, str(op))
    name = getattr(op, "name", None)
    if name is None and hasattr(op, "op"):  # a ReduceOp object (e.g. made by _make_nccl_premul_sum)
        return reduce_op_name(op.op)
    return name or str(op)


def _group_text(group):
    """None for the default group (not worth a word), else 'ranks [0, 2]'."""
    try:
        if group is dist.distributed_c10d._get_default_group():
            return None
        return f"ranks {dist.get_process_group_ranks(group)}"
    except (RuntimeError, ValueError, KeyError):  # KeyError: a group given by its name, as FSDP2's collectives do
        return "a group"


def call_args(frame):
    """{parameter: text} for the arguments of a torch.distributed function running in frame."""
    code, values = frame.f_code, frame.f_locals
    out = {}
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        value = values.get(name)
        if value is None or name in _IGNORED:
            continue
        text = _group_text(value) if name == "group" else value_text(value)
        if text is not None:
            out[name] = text
    return out


def collective_call(stack):
    """The collective that user code called: {"op", "args", "site"}, or None; stack: (frame, lineno), outermost first.

    The outermost torch.distributed collective below the innermost user frame: all_gather_object, not the
    all_gather it runs inside.
    """
    call = site = None
    for frame, lineno in stack:
        code = frame.f_code
        if is_user_file(code.co_filename):
            site, call = (code.co_filename, lineno, code.co_name), None
        elif call is None and code.co_filename.startswith(_TORCH_DIR) and code.co_name in COLLECTIVES:
            call = frame
    if call is None:
        return None
    return {"op": call.f_code.co_name, "args": call_args(call), "site": site}


def thread_stack(frame):
    """(frame, lineno) pairs from the outermost frame to frame (a thread's current frame)."""
    stack = []
    while frame is not None:
        stack.append((frame, frame.f_lineno))
        frame = frame.f_back
    return stack[::-1]


def traceback_stack(tb):
    """(frame, lineno) pairs of a traceback, outermost first."""
    stack = []
    while tb is not None:
        stack.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return stack


def call_text(call):
    """'all_reduce(tensor=float32[4], op=SUM)'."""
    return f"{call['op']}(" + ", ".join(f"{k}={v}" for k, v in call["args"].items()) + ")"


def ranks_text(ranks):
    """'rank 1', 'ranks 0 and 2', 'ranks 0, 1 and 3'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _by_value(calls, get):
    """'SUM on ranks 0 and 2, MAX on rank 1' for the values get(call) takes across {rank: call}."""
    groups = {}
    for rank, call in sorted(calls.items()):
        groups.setdefault(get(call), []).append(rank)
    return ", ".join(f"{value if value is not None else 'nothing'} on {ranks_text(r)}" for value, r in groups.items())


def differences(calls):
    """What differs between the ranks' calls ({rank: call}), as phrases: ['op: SUM on rank 0, MAX on rank 1']."""
    if len({c["op"] for c in calls.values()}) > 1:
        return [f"the collective: {_by_value(calls, lambda c: c['op'])}"]
    names = []
    for call in calls.values():
        names += [n for n in call["args"] if n not in names]
    return [f"{name}: {_by_value(calls, lambda c, n=name: c['args'].get(n))}" for name in names
            if len({c["args"].get(name) for c in calls.values()}) > 1]
