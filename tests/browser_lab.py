"""JupyterLab and headless Chromium for tests/test_browser.py and tests/test_journey.py: start, drive a notebook,
stop everything.

Lab (test_browser.py) runs the server from this venv on a free loopback port with a random token, on copies of
the notebooks; MakeLab (test_journey.py) runs `make lab` in a copy of the repository and reads the URL it prints.
Both give the server Jupyter directories of its own (no user settings, workspaces or kernelspecs). Every process
it starts (server, kernels, their ranks) carries a marker in its environment, so teardown can find them all, even
the ones a dead parent left behind, and kill exactly those.

Given a zygote (make test, which loads tests/warm_kernels.py: the socket of the pytest worker's zygote), the
server's "python3" kernels are forks of it, as nbval's are: a kernel started the usual way costs ~4 s of CPU (an
interpreter importing torch and ipykernel) and ~6 s more at its first launch (the forkserver, a second interpreter
importing torch and torch._dynamo); forked, well under one. A forked kernel's /proc environment is the zygote's,
without the marker, so teardown also finds processes by their working directory, the notebooks' root (the
kernels start there and their ranks inherit it). The usual start-up path is tests/test_kernel.py's, and this
file's run without the plugin.
"""
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Settings a person would also choose: no news or update pop-ups; every cell in the DOM (the default
# "contentVisibility" windowing leaves far-away cells unrendered, which hides outputs from the page).
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The notebook on screen (other tabs' panels stay in the DOM, hidden).
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
# The kernel's busy prompt; a finished cell shows a number, "[12]:".
BUSY_PROMPT = "[*]:"


def free_port():
    """A loopback port nobody listens on right now (bound to port 0, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def feedback_notebook(path):
    """Lab 03's imports, then three answers a student might write, each followed by its check cell:
    a right 3.1, a 3.3 that forgets the division, and chapter 03's loop for 3.3, which deadlocks."""
    from tests.mistakes import lab03

    lab = nbformat.read(lab03.SOLUTION, as_version=4)
    cells = {cell.get("id"): cell.source for cell in lab.cells}
    mistakes = {m.name: m.override for m in lab03.MISTAKES}
    sources = [
        cells["imports"],
        "# right: the solution of 3.1\n" + cells["q31"] + '\n\ncheck("3.1", globals())',
        "# wrong: 3.3 without the division" + mistakes["sum without the division"] + '\ncheck("3.3", globals())',
        "# deadlock: chapter 03's loop for 3.3" + next(o for n, o in mistakes.items() if n.startswith("chapter 03"))
        + '\ncheck("3.3", globals())',
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    nb.metadata = lab.metadata
    nbformat.write(nb, path)


def copy_clean(notebook, dest_dir, through=None):
    """Copy a notebook without outputs, execution counts or saved widget state: what the page then
    shows was produced in this run. through: keep the cells up to the first code cell starting with it."""
    nb = nbformat.read(notebook, as_version=4)
    if through is not None:
        last = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith(through))
        nb.cells = nb.cells[:last + 1]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, pathlib.Path(dest_dir) / pathlib.Path(notebook).name)


def jupyter_dirs(home):
    """Jupyter's directories (config, data, runtime, IPython's) under home: no user settings, workspaces or
    kernelspecs of this machine's user."""
    home = pathlib.Path(home)
    return {"JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython")}


def write_config(config):
    """The server's config (no news feed) and USER_SETTINGS, in the Jupyter config directory `config`."""
    config = pathlib.Path(config)
    config.mkdir(parents=True, exist_ok=True)
    # news_url=None turns the news feed off; it cannot be given on the command line.
    (config / "jupyter_server_config.json").write_text(json.dumps({"LabApp": {"news_url": None}}))
    for name, values in USER_SETTINGS.items():
        path = config / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def warm_kernel_env(home, config, zygote):
    """The python3 kernelspec with the zygote's provisioner and the server config that registers it; the
    server's environment variables that point it at the zygote."""
    from tests.warm_kernels import PROVISIONER, SOCKET_ENV

    # On JUPYTER_PATH, which comes before the venv's own python3 (in a venv, jupyter_core puts the venv's
    # directories before JUPYTER_DATA_DIR: a spec there was ignored, and the kernels started the usual way).
    spec = pathlib.Path(home) / "kernelspecs" / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python",  # as ipykernel's own, on the page
        "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER}}}))
    (pathlib.Path(config) / "jupyter_server_config.py").write_text(  # the server runs it at start
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests import warm_kernels\nwarm_kernels.register_provisioner()\n")
    kernelspecs = str(pathlib.Path(home) / "kernelspecs")
    jupyter_path = os.pathsep.join(p for p in (kernelspecs, os.environ.get("JUPYTER_PATH")) if p)
    return {SOCKET_ENV: zygote, "JUPYTER_PATH": jupyter_path}


def started_by(marker, root=None):
    """Pids of live processes whose environment holds DP_COURSE_BROWSER_TEST=marker (a server, the kernels it
    started, their ranks) or, given root, whose working directory is root or under it (a kernel forked by the
    zygote: its /proc environment is the zygote's, without the marker; its ranks inherit its directory)."""
    needle = f"DP_COURSE_BROWSER_TEST={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0") and not _works_under(entry, root):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def _works_under(pid, root):
    """Whether the process's working directory is root or under it."""
    if root is None:
        return False
    try:
        return pathlib.Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(pathlib.Path(root).resolve())
    except OSError:
        return False


def kill_all(pids, signum=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class Lab:
    """`jupyter lab` serving root_dir; state (config, data, runtime, settings) lives under home."""

    def __init__(self, root_dir, home, zygote=None):
        self.root_dir, self.home, self.zygote = pathlib.Path(root_dir), pathlib.Path(home), zygote
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.marker = f"dp-course-browser-{secrets.token_hex(8)}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self, timeout=60.0):
        config = self.home / "config"
        write_config(config)
        env = dict(os.environ, **jupyter_dirs(self.home), DP_COURSE_BROWSER_TEST=self.marker)
        if self.zygote:
            env.update(warm_kernel_env(self.home, config, self.zygote))
        env.pop("JUPYTERLAB_SETTINGS_DIR", None)
        env.pop("JUPYTERLAB_WORKSPACES_DIR", None)
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False",
               "--ServerApp.allow_root=True"]  # CI runs as root
        self.log = open(self.home / "server.log", "w")
        # Own process group for the server; kernels start sessions of their own (jupyter_client does
        # that), which is why stop() finds them by the environment marker.
        self.proc = subprocess.Popen(cmd, cwd=self.root_dir, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.api("status"), timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n{self.log_text()}")

    def api(self, path):
        return f"{self.url}/api/{path}?token={self.token}"

    def lab_url(self):
        # reset: start from an empty workspace, not reopen the notebooks of an earlier page
        return f"{self.url}/lab?reset&token={self.token}"

    def shutdown_kernels(self):
        """Shut down every running kernel (DELETE /api/kernels/<id>), as Kernel > Shut Down does."""
        with urllib.request.urlopen(self.api("kernels"), timeout=10) as reply:
            kernels = json.load(reply)
        for kernel in kernels:
            request = urllib.request.Request(self.api(f"kernels/{kernel['id']}"), method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()

    def log_text(self):
        return (self.home / "server.log").read_text(errors="replace")[-4000:]

    def processes(self):
        """Pids of live processes started by this server (itself, kernels, ranks)."""
        return started_by(self.marker, self.root_dir if self.zygote else None)

    def stop(self, timeout=15.0):
        """SIGTERM the server's group (it shuts its kernels down), then SIGKILL whatever carries the
        marker. Returns the pids that had to be killed (empty when the shutdown was clean)."""
        if self.proc is None:
            return []
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.proc.poll() is None or self.processes()):
            time.sleep(0.2)
        leftovers = self.processes()
        kill_all(leftovers)
        if self.proc.poll() is None:
            self.proc.wait(5)
        self.log.close()
        return leftovers


def copy_checkout(dest):
    """The repository's tracked files (as they are in the working tree) copied into dest, with their times, and
    .venv a link to this one's: `make lab` there finds .venv/.installed newer than pyproject.toml, as here, and
    does not reinstall. Returns dest."""
    dest = pathlib.Path(dest)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # not a file deleted in the working tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)  # copy2: with its modification time
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


# The URL JupyterLab prints for the loopback address, token included.
PRINTED_URL = re.compile(r"http://127\.0\.0\.1:(?P<port>\d+)(?P<path>/[^?\s]*)\?token=(?P<token>\w+)")


class MakeLab:
    """`make lab` as a student runs it (headless, so --no-browser; as root here, so --allow-root), in `checkout`,
    with Jupyter's directories under `home`; the URL, port and token are read from what it prints.

    Given a zygote (make test), the server's python3 kernels are forks of it (warm_kernel_env), through the
    environment only: the command stays `make lab`. Stopped by SIGTERM to the process group of the make started
    here (make and, by its exec, JupyterLab, which shuts its kernels down); the kernels lead sessions of their
    own, so leftovers are found by the marker in their environment or their working directory in the checkout.
    """

    def __init__(self, checkout, home, zygote=None):
        self.checkout, self.home, self.zygote = pathlib.Path(checkout), pathlib.Path(home), zygote
        self.marker = f"dp-course-make-lab-{secrets.token_hex(8)}"
        self.log_path = self.home / "make_lab.log"
        self.make = self.url = self.port = self.token = self.leftovers = None

    def environment(self):
        """This process's environment without a display (the headless machine) or make's variables (not a
        sub-make of make test), with Jupyter's directories of our own."""
        dropped = ("DISPLAY", "WAYLAND_DISPLAY", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "JUPYTER_ARGS",
                   "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        env.update(jupyter_dirs(self.home), DP_COURSE_BROWSER_TEST=self.marker)
        write_config(self.home / "config")
        if self.zygote:
            env.update(warm_kernel_env(self.home, self.home / "config", self.zygote))
        return env

    def start(self, timeout=90.0):
        """Run `make lab`; return once it has printed its URL and the server answers there."""
        with open(self.log_path, "w") as log:
            self.make = subprocess.Popen(["make", "--no-print-directory", "lab"], cwd=self.checkout,
                                         env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.make.poll() is not None:
                raise RuntimeError(f"make lab exited ({self.make.returncode}) before serving:\n{self.log_text()}")
            printed = PRINTED_URL.search(self.log_text())
            if printed:
                self.url, self.port, self.token = printed[0], int(printed["port"]), printed["token"]
                # jupyter_server prints the URL before its event loop binds the port (CI of f0390d5 was refused)
                try:
                    with urllib.request.urlopen(self.api("status"), timeout=2) as reply:
                        if reply.status == 200:
                            return self
                except OSError:
                    pass
            time.sleep(0.25)
        raise RuntimeError(f"make lab served nothing within {timeout:.0f} s; it printed:\n{self.log_text()}")

    def api(self, path):
        return f"http://127.0.0.1:{self.port}/api/{path}?token={self.token}"

    def get(self, url):
        """(status, body) of a GET; an HTTP error's status too."""
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def log_text(self):
        return self.log_path.read_text(errors="replace")

    def processes(self):
        """Pids of live processes started by make lab (make, JupyterLab, kernels, ranks)."""
        return started_by(self.marker, self.checkout)

    def stop(self, timeout=30.0):
        """SIGTERM make's process group, wait for everything it started to end, SIGKILL what has not.
        Returns the pids that had to be killed (empty when the shutdown was clean); called again, those."""
        if self.make is None or self.leftovers is not None:
            return self.leftovers or []
        if self.make.poll() is None:  # not reaped: its pid, the group's id, cannot have been reused
            os.killpg(self.make.pid, signal.SIGTERM)
        else:
            kill_all(self.processes(), signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.make.poll() is None or self.processes()):
            time.sleep(0.2)
        self.leftovers = self.processes()
        kill_all(self.leftovers)
        self.make.wait(10)
        return self.leftovers


def launch_chromium(playwright, executable, user_data_dir):
    """Headless Chromium with a fresh profile, nothing phoning home."""
    return playwright.chromium.launch_persistent_context(
        user_data_dir=str(user_data_dir), executable_path=executable, headless=True,
        args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})


def open_lab(page, lab, timeout_ms=60_000):
    """Load JupyterLab in the tab, from an empty workspace, and wait for its file browser."""
    page.goto(lab.lab_url())
    page.locator(".jp-DirListing-item").first.wait_for(timeout=timeout_ms)


def open_notebook(page, name, timeout_ms=60_000):
    """Open a notebook from the file browser (a double click, as a person would) in the JupyterLab of the tab,
    and wait until its kernel is connected and idle."""
    # The status indicator says "idle" before the kernel exists; it is true only once the kernel's
    # websocket has opened (initializing -> connecting -> idle). Run All before that does nothing.
    label = page.locator(".jp-DirListing-itemText", has_text=re.compile("^" + re.escape(name) + "$"))
    with page.expect_websocket(lambda ws: "/api/kernels/" in ws.url, timeout=timeout_ms):
        page.locator(".jp-DirListing-item", has=label).dblclick()
    idle = page.locator(f"{NOTEBOOK} .jp-Notebook-ExecutionIndicator[data-status='idle']")
    idle.wait_for(timeout=timeout_ms)


def close_notebook(page):
    """Close the tab of the notebook on screen, discarding its changes (its cells ran, so JupyterLab asks): the
    next notebook opened is then the only one in the page."""
    current = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")
    current.locator(".lm-TabBar-tabCloseIcon").click()
    page.locator(".jp-Dialog button", has_text=re.compile("^Discard$")).click()
    page.locator(NOTEBOOK).wait_for(state="detached")


def run_all_cells(page):
    """Run > Run All Cells, through the menu bar as a person would."""
    run_menu(page, "Run All Cells")


# Run in the page: Python asking through Playwright's driver costs a round trip per locator (Python, its node
# driver, Chromium), twice a second while the cells run; an evaluation in the page costs the page alone.
PROMPTS_JS = """notebook => [...document.querySelectorAll(notebook + " .jp-CodeCell .jp-InputPrompt")]
    .map(prompt => prompt.innerText.trim())"""
ERRORS_JS = """notebook => [...document.querySelectorAll(notebook +
        " .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")]
    .map(output => output.innerText)
    .filter(text => text.includes("Traceback") || /^\\w*(Error|Exception)\\b/m.test(text))"""
# Finished: the last code cell has a count, or a cell failed and nothing is queued any more.
FINISHED_JS = f"""([notebook, busy]) => {{
    const prompts = ({PROMPTS_JS})(notebook);
    return prompts.length > 0 && !prompts.includes(busy)
        && (/^\\[\\d+\\]:$/.test(prompts[prompts.length - 1]) || ({ERRORS_JS})(notebook).length > 0);
}}"""


def prompts(page):
    """Every code cell's input prompt text in order, e.g. ['[1]:', '[*]:', '[ ]:']."""
    return page.evaluate(PROMPTS_JS, NOTEBOOK)


def wait_until_run(page, timeout_s):
    """Wait until the run has finished (FINISHED_JS, checked twice a second). Returns the prompts."""
    # here: tests/test_browser.py imports this module before it skips where playwright is missing
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    try:
        page.wait_for_function(FINISHED_JS, arg=[NOTEBOOK, BUSY_PROMPT], polling=500, timeout=timeout_s * 1000)
    except PlaywrightTimeoutError:
        raise TimeoutError(f"cells still running after {timeout_s:.0f} s: {prompts(page)}") from None
    return prompts(page)


def error_texts(page):
    """Text of every output that is an error (a traceback or `SomethingError: ...` on stderr)."""
    return page.evaluate(ERRORS_JS, NOTEBOOK)


def code_cell(page, starting_with):
    """The code cell of the notebook on screen whose source starts with the given text."""
    editor = page.locator(".cm-content", has_text=re.compile("^" + re.escape(starting_with)))
    return page.locator(f"{NOTEBOOK} .jp-CodeCell").filter(has=editor)


def run_menu(page, item):
    """Run > item, through the menu bar as a person would (item: the label, e.g. "Run All Cells")."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^" + re.escape(item) + "$")).click()
