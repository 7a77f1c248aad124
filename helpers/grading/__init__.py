"""Grading: public checks students run in their notebooks, and lab generation from solutions."""
import sys

from helpers.grading.check import CheckResult, check

__all__ = ["check", "CheckResult"]

# The grader reads notebooks with nbformat, which imports jsonschema, which imports rfc3987_syntax where it is
# installed (jupyter_events asks for it) and builds an Earley parser for IRIs at import: 2.6-3.1 s of CPU in each
# interpreter that imports the grading modules (the class grader, and its forkserver: measured 6.0 -> 3.4 s for
# `import helpers.grading.grade_student`), for a format nbformat never checks (it validates without a format
# checker). Without the module, jsonschema leaves "iri" unchecked. tests/warm_kernels.py does the same for pytest.
sys.modules.setdefault("rfc3987_syntax", None)
