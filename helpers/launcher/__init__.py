"""How `launch` and `%%ranks` run ranks: the machinery behind helpers.launch, not called by notebooks.

  the run       run (one call seen from the kernel), run_status, rank_output (each rank's live output),
                worker (the rank side; its docstring holds the protocol), forkserver, hugepages (the
                forkserver's memory in 2 MiB pages: cheap forks), kernel (a Jupyter kernel
                whose forkserver is forked before any thread), magic (%%ranks N), main_guard (scripts need
                `if __name__ == "__main__":`)
  the reports   hang (where each rank is blocked), on_abort (where a rank was when Gloo aborted it),
                traceback_text, collective_text (a call as reports print it), collective_check
                (check_collectives=True: ranks compare each collective before running it)
  the GPU path  device_guard (the CPU-side check that every collective gets a tensor on rank_device())
"""
import os

# Frames in files under helpers/ are the course's, not the learner's: reports skip them.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
