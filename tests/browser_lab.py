"""JupyterLab and headless Chromium for tests/test_browser.py: start, drive a notebook, stop everything.

The server runs from this venv on a free loopback port with a random token, in Jupyter directories of
its own (no user settings, workspaces or kernelspecs), on copies of the notebooks. Every process it
starts (server, kernels, their ranks) carries a marker in its environment, so teardown can find them
all, even the ones a dead parent left behind, and kill exactly those.

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
import signal
import socket
import subprocess
import sys
import time
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
        # news_url=None turns the news feed off; it cannot be given on the command line.
        (config / "jupyter_server_config.json").parent.mkdir(parents=True, exist_ok=True)
        (config / "jupyter_server_config.json").write_text(json.dumps({"LabApp": {"news_url": None}}))
        for name, values in USER_SETTINGS.items():
            path = config / "lab" / "user-settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config),
                   JUPYTER_DATA_DIR=str(self.home / "data"),
                   JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
                   IPYTHONDIR=str(self.home / "ipython"),
                   DP_COURSE_BROWSER_TEST=self.marker)
        if self.zygote:
            env.update(self._warm_kernels(config))
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

    def _warm_kernels(self, config):
        """The python3 kernelspec with the zygote's provisioner and the server config that registers it; the
        server's environment variables that point it at the zygote."""
        from tests.warm_kernels import PROVISIONER, SOCKET_ENV

        # On JUPYTER_PATH, which comes before the venv's own python3 (in a venv, jupyter_core puts the venv's
        # directories before JUPYTER_DATA_DIR: a spec there was ignored, and the kernels started the usual way).
        spec = self.home / "kernelspecs" / "kernels" / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python",  # as ipykernel's own, on the page
            "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER}}}))
        (config / "jupyter_server_config.py").write_text(  # the server runs it at start
            f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            "from tests import warm_kernels\nwarm_kernels.register_provisioner()\n")
        jupyter_path = os.pathsep.join(p for p in (str(self.home / "kernelspecs"), os.environ.get("JUPYTER_PATH")) if p)
        return {SOCKET_ENV: self.zygote, "JUPYTER_PATH": jupyter_path}

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
        """Pids of live processes started by this server (itself, kernels, ranks), by the marker."""
        needle = f"DP_COURSE_BROWSER_TEST={self.marker}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle not in f.read().split(b"\0") and not self._works_here(entry):
                        continue
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            found.append(int(entry))
        return found

    def _works_here(self, pid):
        """Whether the process's working directory is the notebooks' root (a kernel forked by the zygote)."""
        try:
            return self.zygote and pathlib.Path(os.readlink(f"/proc/{pid}/cwd")) == self.root_dir.resolve()
        except OSError:
            return False

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
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(5)
        self.log.close()
        return leftovers


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
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


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
