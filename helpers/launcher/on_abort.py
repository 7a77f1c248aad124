"""Run a Python function when the process aborts (SIGABRT), before it dies: where was the rank?

Gloo reports a collective whose sizes differ between ranks by throwing in one of its own threads, and an
exception there ends in std::terminate, then abort(). A diagnostic tool: the function it runs reads the
stack of the main thread, which is its job.
Why ctypes: signal.signal cannot do this. CPython's C-level handler only sets a flag for the main thread to
act on between bytecodes, and the main thread is blocked inside the collective; abort() kills the process as
soon as the handler returns. A C function pointer made by ctypes runs at once, in the aborting thread, and
ctypes takes the GIL before calling Python (the main thread released it while it waits in the collective).
When the function returns, abort() goes on: the process still dies by SIGABRT, as the kernel expects.
"""
import ctypes
import signal

_installed = []  # the C callback must outlive the handler, or the process would jump into freed memory


def on_abort(fn):
    """Call fn() when this process receives SIGABRT, then let it die as it would have."""
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)

    def handler(signum):
        try:
            fn()
        except BaseException:  # noqa: BLE001 - the process is dying; nothing may stop abort() from finishing
            pass

    callback = handler_type(handler)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, handler_type)
    libc.signal(signal.SIGABRT, callback)
    _installed.append(callback)
