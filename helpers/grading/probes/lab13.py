"""Hidden tests of lab 13 (compression and local steps). Public in this repository: see the README.

Each question's probe runs the public checks' own rank function (the student's hook or local SGD beside PyTorch's
version and the usual wrong versions) with the checks' OFFSET set from the question's secret seed: other initial
parameters and other batches on every rank. A value that is not the solution's is diagnosed by the question's public
checks themselves, run in the grader on that value (judges.by_public_checks), so the feedback says what the check says.
"""
from helpers.grading.checks.lab13 import common
from helpers.grading.checks.lab13 import q1_compress_hook as q1
from helpers.grading.checks.lab13 import q2_powersgd_hook as q2
from helpers.grading.checks.lab13 import q3_local_sgd as q3
from helpers.grading.probes import Probe
from helpers.grading.probes.judges import by_public_checks
from helpers.grading.probes.offsets import OFFSETS, at_offset_setup

SETUP = '''
from helpers.grading.shared_run import launch_gloo as _probe_launch
from helpers.grading.checks.lab13 import (q1_compress_hook as _probe_q1, q2_powersgd_hook as _probe_q2,
                                          q3_local_sgd as _probe_q3)
''' + at_offset_setup("lab13") + '''

def _probe_run(fn, answer):
    return _probe_launch(_probe_at_offset, 3, args=(_probe_offset, fn, answer), hang_timeout=30)
'''


def _checks(question, module, answer):
    return by_public_checks(question, (module, "_results"), (common, OFFSETS), names=(answer,))


PROBES = [
    Probe("13.1", "3 ranks, fp16 and bf16 with and without error feedback, next to PyTorch's hooks",
          "_probe_run(_probe_q1._on_rank, compress_hook)", points=4,
          judge=_checks("13.1", q1, "compress_hook"), hint=q1.HINT,
          forbidden=("fp16_compress_hook", "bf16_compress_hook", "default_hooks")),
    Probe("13.2", "3 ranks, rank 2, 2 plain steps then 4 compressed, next to powerSGD_hook",
          "_probe_run(_probe_q2._on_rank, powersgd_hook)", points=4,
          judge=_checks("13.2", q2, "powersgd_hook"), hint=q2.HINT,
          forbidden=("powerSGD_hook", "powerSGD", "PowerSGDState")),
    Probe("13.3", "3 ranks, 12 steps averaged every 4, next to PeriodicModelAverager and DDP",
          "_probe_run(_probe_q3._on_rank, local_sgd)", points=3,
          judge=_checks("13.3", q3, "local_sgd"), hint=q3.HINT,
          forbidden=("PeriodicModelAverager", "averagers", "model_averaging")),
]

# No question's probes call another question's answer (helpers/grading/judge/reference.py).
USES = {}
