"""Preparing a run: the labs from solutions, the student release, the submissions read without trust, the graded
notebook."""
