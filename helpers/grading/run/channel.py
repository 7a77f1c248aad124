"""The probes' channel: a pipe the grader opens for each kernel, by which the probe cells' values reach it.

The protocol, spoken by probe_runtime.run_probes in the kernel and read here in the grader:
    the grader   os.pipe() before the kernel starts; the write end goes into the kernel (Popen pass_fds, through
                 prlimit, setpriv and bwrap, which keep it open), its number in the kernel's environment as
                 FD_VARIABLE; a thread reads the other end for as long as the kernel lives.
    the kernel   probe_runtime reads FD_VARIABLE when it is imported, before any student cell runs; each probe cell
                 writes one line, `<mac> <body>\\n`: body is the question's values as ASCII JSON {"question": ...,
                 "results": [...], "own": [...]}, mac the HMAC-SHA256 of body keyed by the probe cell's nonce, in hex.
    the grader   accepts, for a probe cell, the lines whose mac its nonce verifies: exactly one is the result; more
                 than one (something else wrote one with the nonce) is FORGED; none, the probe did not run.
Why not IPython's display, as the probes did: what a probe displays passes through code the student's cells can
replace (display, the display publisher, the kernel session's packing, `json`), and an answer that rewrote the values
and kept the nonce scored full marks. No code of the kernel's touches this line between the probe and the grader:
its encoder, HMAC and write are C functions captured here when the module is imported, before any student cell.
A student's code can write on the pipe too (the fd number is no secret), but without the nonce, which reaches the
kernel only in its own probe cell, no line of it verifies: what it writes is dropped, and costs only itself.
"""
import _hashlib
import _json
import hmac
import os
import select
import threading
import time

FD_VARIABLE = "DP_COURSE_PROBE_FD"
# One probe cell's values (raw batches and parameters) may be large: a line longer than this is dropped, and so is
# what a kernel writes past CHANNEL_BYTES (a student's code writing garbage on the pipe).
MAX_RECORD_BYTES = 20_000_000
CHANNEL_BYTES = 64 * 2**20
# Once the kernel is gone, what is left in the pipe is read for at most this long: a process that escaped the kernel's
# end (a daemon, where no sandbox kills it) and writes without pause cannot hold the grader.
DRAIN_SECONDS = 1.0

# Captured at import, in the kernel before any student cell: C functions, which no assignment can change.
_write = os.write
_hmac_digest = _hashlib.hmac_digest


def _unencodable(value):
    raise TypeError(f"a probe value of type {type(value).__name__} is not plain data")


# json.dumps(separators=(",", ":")) as one C object (json.dumps itself is Python, looked up in modules at call time).
_encode = _json.make_encoder(None, _unencodable, _json.encode_basestring_ascii, None, ":", ",", False, False, True)


def mac(key, body):
    """The HMAC-SHA256 of body (bytes) keyed by key (str), in hex."""
    return _hmac_digest(key.encode(), body, "sha256").hex()


def record(key, value):
    """The line that carries value (plain data), signed with key."""
    body = "".join(_encode(value, 0)).encode("ascii")
    return mac(key, body).encode("ascii") + b" " + body + b"\n"


def send(fd, line):
    """Write line whole on fd (a pipe takes it in pieces when it is longer than the pipe's buffer)."""
    view = memoryview(line)
    while view:
        view = view[_write(fd, view):]


def verified(lines, key):
    """The bodies (bytes) of the lines whose mac key verifies, in order."""
    found = []
    for line in lines:
        head, _, body = line.partition(b" ")
        if hmac.compare_digest(head, mac(key, body).encode("ascii")):
            found.append(body)
    return found


class Channel:
    """The grader's end of one kernel's pipe: `fd` goes into the kernel; `lines()` after it is gone."""

    def __init__(self, max_bytes=CHANNEL_BYTES):
        self._read, self.fd = os.pipe()
        self.max_bytes, self.dropped = max_bytes, 0
        self._chunks, self._kept = [], 0
        self._done, self._until = threading.Event(), None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def started(self):
        """The kernel holds the write end now: close the grader's copy."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _run(self):
        # Read all the time: a probe's 20 MB would fill the pipe's 64 KiB and block the kernel. A kernel writing past
        # max_bytes is still read (it would block otherwise), and what it wrote is dropped.
        while True:
            ready, _, _ = select.select([self._read], [], [], 0.2)
            if self._done.is_set() and (not ready or time.monotonic() > self._until):
                return
            if not ready:
                continue
            chunk = os.read(self._read, 2**20)
            if not chunk:
                return
            if self._kept + len(chunk) <= self.max_bytes:
                self._chunks.append(chunk)
                self._kept += len(chunk)
            else:
                self.dropped += len(chunk)

    def lines(self):
        """Stop reading (the kernel is dead); every complete line it wrote, each at most MAX_RECORD_BYTES."""
        self.started()
        self._until = time.monotonic() + DRAIN_SECONDS
        self._done.set()
        self._thread.join()
        os.close(self._read)
        data, self._chunks = b"".join(self._chunks), []
        return [line for line in data.split(b"\n")[:-1] if len(line) <= MAX_RECORD_BYTES]
