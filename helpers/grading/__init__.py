"""Grading: public checks students run in their notebooks, and lab generation from solutions."""
from helpers.grading.check import CheckResult, check

__all__ = ["check", "CheckResult"]
