"""A rank's exception as the learner wants to read it: their own lines, with source."""
import textwrap

from helpers.hang import describe_file, is_user_file, source_line

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


def wrap_report(text, width=REPORT_WIDTH):
    """Each line of text wrapped on words; a continuation is indented 4 more than its line's own indent."""
    out = []
    for line in text.splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, width, subsequent_indent=indent + "    ", break_long_words=False,
                             break_on_hyphens=False) or [""]
    return "\n".join(out)
