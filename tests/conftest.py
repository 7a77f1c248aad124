"""Every test starts with SIGINT answered as Python answers it, as in a Jupyter kernel.

In CI the pytest-xdist worker processes were found with SIGINT ignored at the OS level (/proc SigIgn) while
signal.getsignal() reported Python's default handler: something calls sigaction() under Python's feet (cause not
found yet). An ignored signal is inherited by the kernels and scripts the tests start, so interrupt tests failed
for a reason no student meets: Jupyter starts kernels with SIGINT at its default. Put it back before each test.
"""
import os
import signal

import pytest


def sigint_ignored():
    """Whether the kernel (the OS) ignores SIGINT for this process, whatever Python's handler table says."""
    with open(f"/proc/self/task/{os.getpid()}/status") as f:
        fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    return bool(int(fields["SigIgn"], 16) & (1 << (signal.SIGINT - 1)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # A hook, not a fixture: it runs before every fixture of the test, module-scoped kernels included.
    if os.path.exists(f"/proc/self/task/{os.getpid()}/status") and sigint_ignored():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # also resets the OS-level disposition
