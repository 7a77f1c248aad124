"""A rank's exception as the learner wants to read it: their own lines, with source."""
import re
import textwrap

from helpers.launcher.collective_text import call_text, differences
from helpers.launcher.hang import (
    describe_file,
    describe_site,
    is_user_file,
    source_line,
)

# JupyterLab breaks a long output line anywhere, mid-word included; reports keep their lines this short.
REPORT_WIDTH = 88

# Messages a rank gets when a peer crashed: symptoms, not causes.
_SECONDARY = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "connection closed", "recvBytes")


def is_secondary_error(message):
    """True when a failure is most likely an echo of another rank's crash."""
    if message[0] != "error":
        return False
    return any(s in message[1]["message"] for s in _SECONDARY)


def format_rank_error(rank, info):
    """'rank 1 raised ValueError: ...' plus the traceback frames of user code with their source."""
    frames = [f for f in info["frames"] if is_user_file(f[0])] or info["frames"]
    lines = [f"rank {rank} raised {info['type']}: {info['message']}", "Traceback (user code, innermost last):"]
    for filename, lineno, name, line in frames:
        # Notebook cells exist only in the kernel's line cache, so the kernel fills their source.
        line = source_line(filename, lineno) or (line or "").strip()
        lines.append(f"  {describe_file(filename)}, line {lineno}, in {name}")
        if line:
            lines.append(f"    {line}")
    lines.append("The other ranks were stopped. Fix the error above and run the cell again.")
    return "\n".join(lines)


# What C++ prints before abort(): `  what():  [enforce fail at .../gloo/transport/tcp/pair.cc:456] <reason>`.
_WHAT = re.compile(r"what\(\):\s*(?:\[enforce fail at (\S+)\]\s*)?(.*)")

MISMATCH_ADVICE = ("Every rank must call the same collectives in the same order, with the same shapes, dtypes and "
                   "reduce op. launch(..., check_collectives=True) (%%ranks N --check-collectives) compares the "
                   "ranks' calls before each collective and names the first that differs.")


def abort_reason(stderr):
    """The reason C++ printed before aborting ('op.preamble.length <= op.nbytes. 8 vs 4. ...'), or None."""
    found = [m for m in map(_WHAT.search, stderr.splitlines()) if m]
    if not found:
        return None
    where, reason = found[-1].groups()
    # the path inside Gloo's repository (torch vendors it as third_party/gloo)
    return f"{reason.strip()} ({where.split('third_party/gloo/')[-1]})" if where else reason.strip()


def _rank_line(state, data):
    """Where one rank was when another aborted: its call and line, and what became of it."""
    call = (data or {}).get("call") if state != "died" else None
    if state == "died":
        return "died too"
    if state == "raised" and not call:
        return f"raised {data['type']}: {data['message'].splitlines()[0] if data['message'] else ''}"
    if not call:
        return {"finished": "had finished its function", "gone": "no answer (process gone)"}.get(
            data.get("phase"), "running, not in a collective")
    if state == "raised":
        lost = ": it lost its connection to the aborted rank" if is_secondary_error(("error", data)) else ""
        after = f" (then raised {data['type']}{lost})"
    else:
        after = " (aborted there)" if state == "aborted" else " (still waiting there)"
    return f"{call_text(call)} at {describe_site(call['site'])}{after}"


def format_abort(rank, how, where, stderr):
    """rank aborted inside a collective; where: {rank: (state, report or error info)}, state in
    aborted / raised / died / running."""
    lines = [f"rank {rank} {how} inside a collective; the other ranks were stopped. Where each rank was:"]
    lines += [f"  rank {r}: {_rank_line(*where[r])}" for r in sorted(where)]
    reason = abort_reason(stderr)
    if reason:
        lines.append(f"Gloo's reason, printed by rank {rank} before it aborted: {reason}")
    calls = {r: data["call"] for r, (state, data) in where.items() if state != "died" and (data or {}).get("call")}
    diff = differences(calls) if len(calls) > 1 else []
    if diff:
        lines.append("The calls differ in " + "; ".join(diff) + ".")
    lines.append(MISMATCH_ADVICE)
    return "\n".join(lines)


def wrap_report(text, width=REPORT_WIDTH):
    """Each line of text wrapped on words; a continuation is indented 4 more than its line's own indent."""
    out = []
    for line in text.splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, width, subsequent_indent=indent + "    ", break_long_words=False,
                             break_on_hyphens=False) or [""]
    return "\n".join(out)
