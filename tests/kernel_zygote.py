"""A process that has imported torch and ipykernel once, and forks a Jupyter kernel for every request.

Run by tests/warm_kernels.py (one per pytest worker): `python tests/kernel_zygote.py SOCKET_PATH`, its stdin
a pipe from the pytest worker (EOF: kill the kernels, exit). A kernel costs about 10 s of CPU on the 2-core CI
machine when started the usual way (interpreter, torch, ipykernel, then the launcher's forkserver: a second
interpreter and torch again); forked from here, well under a second, and its forkserver is a fork too
(helpers.launcher.forkserver.start_by_fork). make test starts about 40 kernels.

Protocol, one AF_UNIX connection per kernel: the client sends the length of a JSON request {argv, env, cwd} (8
bytes) with its stdout and stderr as file descriptors (SCM_RIGHTS), then the request; the zygote answers
{"pid": n} once the child leads its own session (so that a signal to the kernel's process group never reaches
the zygote), and {"exit": code} when it ends.
Closing the connection before that kills the kernel's session.

Why a fork is safe here: nothing in this process starts a thread or a ZeroMQ context before forking (importing
torch starts one native thread, as it does in multiprocessing's own forkserver, which forks ranks the same way).
"""
import importlib
import json
import os
import selectors
import signal
import socket
import sys

# As ipykernel sets it in a kernel whose environment lacks it, before matplotlib is imported here.
os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
# nbformat (preloaded) imports jsonschema, which imports rfc3987_syntax where it is installed (jupyter_events asks
# for it) and builds an Earley parser for IRIs at import: 2.2 s of CPU, for a format nbformat never checks (it
# validates without a format checker). Without it, jsonschema leaves "iri" unchecked; the kernels check no schema.
sys.modules.setdefault("rfc3987_syntax", None)

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "helpers", "helpers.launcher.worker",
           "helpers.launcher.kernel", "cloudpickle", "ipykernel.kernelapp", "ipykernel.ipkernel", "matplotlib.pyplot",
           "nbformat"]
MAX_REQUEST = 1 << 20


def main(path):
    # Then what the launcher preloads, DP_COURSE_PRELOAD included (tests/warm_kernels.py RANK_IMPORTS): the
    # kernels' forkservers are forks of the kernels, forks of this process. Huge pages last (helpers.launch).
    from helpers.launch import preload_modules

    for name in [*PRELOAD, *preload_modules()]:
        importlib.import_module(name)
    from helpers.launcher import hugepages

    hugepages.collapse()  # now, not at the 16th kernel: every kernel and its forkserver share the huge pages
    base_path = list(sys.path[1:])  # sys.path[0] is this file's directory; a kernel's is its working directory
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_w, False)
    signal.set_wakeup_fd(sig_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD reaches the wakeup fd
    serve(listener, sig_r, base_path)


def serve(listener, sig_r, base_path):
    """Fork a kernel per connection; report each one's exit; stop when the parent closes our stdin."""
    kernels = {}  # pid -> connection
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sig_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    while True:
        for key, _ in selector.select():
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    pid = start_kernel(conn, listener, base_path)
                except (OSError, ValueError, EOFError) as exc:
                    print(f"kernel zygote: a request failed: {exc!r}", file=sys.stderr)
                    pid = 0
                if pid:
                    kernels[pid] = conn
                    selector.register(conn, selectors.EVENT_READ, pid)
                else:
                    conn.close()
            elif key.data == "child":
                os.read(sig_r, 4096)
                for pid, code in reap():
                    conn = kernels.pop(pid, None)
                    if conn is not None:
                        selector.unregister(conn)
                        send(conn, {"exit": code})
                        conn.close()
            elif key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    for pid in kernels:
                        kill_session(pid)
                    return
            else:  # the client went away (or wrote, which it must not): the kernel goes with it
                selector.unregister(key.fileobj)
                kernels.pop(key.data).close()
                kill_session(key.data)


def reap():
    """(pid, exit code) of every child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def kill_session(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def send(conn, message):
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def receive(conn, size):
    """Exactly size bytes from conn (a stream socket may deliver a long request in pieces)."""
    if size > MAX_REQUEST:
        raise ValueError(f"a request of {size} bytes")
    data = b""
    while len(data) < size:
        piece = conn.recv(size - len(data))
        if not piece:
            raise EOFError("the client closed the connection mid-request")
        data += piece
    return data


def start_kernel(conn, listener, base_path):
    """Fork one kernel for the request on conn; its pid once it leads its own session (0 if it could not)."""
    header, fds, _, _ = socket.recv_fds(conn, 8, 2)
    request = json.loads(receive(conn, int.from_bytes(header, "big")))
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        become_kernel(request, fds, ready_w, [conn, listener], base_path)
    os.close(ready_w)
    started = os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    for fd in fds:
        os.close(fd)
    if not started:
        return 0
    send(conn, {"pid": pid})
    return pid


def become_kernel(request, fds, ready_w, sockets, base_path):
    """In the child: the process `python -m ipykernel_launcher ...` would have been, with torch imported."""
    try:
        os.setsid()  # as jupyter_client's Popen(start_new_session=True)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in sockets:
            s.close()
        null = os.open(os.devnull, os.O_RDWR)
        out, err = (fds + [null, null])[:2]
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = [request["cwd"], *pythonpath(request["env"]), *base_path]
        argv = request["argv"]
        if argv[1:3] != ["-m", "ipykernel_launcher"]:
            raise ValueError(f"the zygote starts `python -m ipykernel_launcher ...` only, not {argv}")
        os.write(ready_w, b"1")
        os.close(ready_w)
        from helpers.launcher.kernel import (
            main as run_kernel,  # imported already (PRELOAD)
        )
        run_kernel(argv[3:])  # its forkserver forked before ipykernel starts a thread
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
        import traceback
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def pythonpath(env):
    """Entries of the request's PYTHONPATH that this process did not start with."""
    mine = os.environ.get("PYTHONPATH", "")
    theirs = env.get("PYTHONPATH", "")
    return [p for p in theirs.split(os.pathsep) if p and theirs != mine]


if __name__ == "__main__":
    main(sys.argv[1])
