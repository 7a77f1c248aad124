"""SETUP lines of the probes that run their public checks' own functions with the checks' OFFSET from the secret seed.

Labs 07, 08, 12 and 13 draw their hidden inputs this way: the checks' models, data and streams move with
checks/labNN/common.OFFSET, and a probe sets it to the question's secret seed modulo OFFSETS while it runs.
"""
OFFSETS = 1000  # the checks' OFFSET: the question's secret seed modulo this


def at_offset_setup(lab, keep_tuples=False):
    """Kernel source defining _probe_offset and _probe_at_offset(offset, fn, *args) for checks/<lab>/common.py;
    keep_tuples: the result passes probe_runtime.keep_tuples (tuples kept through the JSON)."""
    result = "keep_tuples(fn(*args))" if keep_tuples else "fn(*args)"
    imports = "\n    from helpers.grading.run.probe_runtime import keep_tuples" if keep_tuples else ""
    return f'''
_probe_offset = _PROBE_SEED % {OFFSETS}


def _probe_at_offset(offset, fn, *args):
    """fn(*args) with the checks' OFFSET set (their models, data and streams move with it); on a rank or here."""
    from helpers.grading.checks.{lab} import common{imports}
    common.OFFSET = offset
    try:
        return {result}
    finally:
        common.OFFSET = 0
'''
