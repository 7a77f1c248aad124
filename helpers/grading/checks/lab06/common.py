"""Shared pieces of lab 06's checks: the keys of model_state_bytes and helpers.theory's byte conventions."""
from helpers import theory

KEYS = ("params", "grads", "optimizer", "total")
# Added to the seeds of 6.4's replicas and data: 0 here. The grader's hidden tests run its check with it set from
# their secret seed (helpers/grading/judge/replay.py), so they say what the check says of other weights and data.
OFFSET = 0
# (param_bytes, grad_bytes, optimizer_bytes) of every convention helpers.theory names
CONVENTIONS = {name: (c["param_bytes"], c["grad_bytes"], c["k"]) for name, c in theory.CONVENTIONS.items()}
