"""Shared pieces of lab 06's checks: the keys of model_state_bytes and helpers.theory's byte conventions."""
from helpers import theory

KEYS = ("params", "grads", "optimizer", "total")
# (param_bytes, grad_bytes, optimizer_bytes) of every convention helpers.theory names
CONVENTIONS = {name: (c["param_bytes"], c["grad_bytes"], c["k"]) for name, c in theory.CONVENTIONS.items()}
