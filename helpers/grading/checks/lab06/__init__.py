"""Public checks of lab 06 (memory anatomy): model states per ZeRO stage, the largest model, activations, DDP.

6.1 and 6.2 compare with helpers.theory (whose formulas are tested against the ZeRO paper's numbers) on many
inputs, and name the category and the stage that differ. 6.3 compares with the bytes autograd really saves,
counted with torch.autograd.graph.saved_tensors_hooks on small blocks, and with the exact count of a GPT-3-sized
block that cannot be built (so the answer must be arithmetic). 6.4 runs the student's training on 3 ranks with
different data: identical parameters, equal to one process, and model states equal to the 6.1 formula.
"""
from helpers.grading.checks.lab06 import (  # noqa: F401 - importing a question's module registers its checks
    q1_model_state_bytes,
    q2_largest_model,
    q3_activation_bytes,
    q4_train_replica,
)
