"""Hostile submissions of the fixture lab 97: each tries to break, slow or fool the grader.

Each entry: (97.1 cell, 97.2 cell, other edit, fair 97.1, fair 97.2, fair status). Processes a submission starts
carry MARKER in their command line, so a test can prove none outlives grading.
"""
import nbformat

from tests.grading import fixture_lab as lab

MARKER = "hostile-marker-7f3a"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
WRONG_SUM = "from helpers import launch\ndef rank_sum(world_size):\n    return 0.0\n"


# A daemon: fork, new session, fork again, sleep; it would hold the grader's stdout for 15 minutes.
DAEMON = f'''import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(900)", "{MARKER}"])
    os._exit(0)
time.sleep(0.5)
''' + lab.ADD

# Look for the solution and the probes everywhere, including the course's git history, and use what is found (a
# solutions/ notebook: OUT/return/<student>/ holds students' notebooks of the same name, infinite_loop's among them,
# which test_the_solution_search_works_outside_the_sandbox ran for its 600 s).
FIND_SOLUTION = '''import glob, json, os, subprocess, helpers
repo = os.path.dirname(os.path.dirname(helpers.__file__))
found = []
for root in ["/tmp", "/root", "/home", os.path.dirname(os.getcwd()), os.path.dirname(os.path.dirname(os.getcwd()))]:
    found += glob.glob(root + "/**/97_fixture.ipynb", recursive=True) + glob.glob(root + "/**/lab97.py", recursive=True)
found += glob.glob(repo + "/solutions/*.ipynb") + glob.glob(repo + "/helpers/grading/probes/lab*.py")
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        args = open(f"/proc/{pid}/cmdline").read().split("\\0")
        found += [a for a in args if "solutions" in a and os.path.isdir(a) and os.listdir(a)]
    except OSError:
        pass
git = subprocess.run(["git", "-C", repo, "show", "HEAD:solutions/03_manual_ddp.ipynb"], capture_output=True)
found += ["git show solutions/03"] if git.returncode == 0 else []
print("FOUND" if found else "NOTHING", found[:5])
for path in found:
    if path.endswith("/solutions/97_fixture.ipynb") and "BEGIN SOLUTION" in open(path).read():
        for cell in json.load(open(path))["cells"]:
            if cell["cell_type"] == "code" and "def " in "".join(cell["source"]):
                exec("".join(cell["source"]))
'''

# Ignore the interrupt, then loop: only killing the kernel stops it. The loop sleeps: the grader sees the same
# busy kernel deaf to its interrupt, and no core burns for the limit and the grace (13 CPU-s a run); the class's
# infinite_loop is the one that spins.
IGNORE_SIGINT = lab.ADD + ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
                           "    time.sleep(0.1)\n")

FORK_BOMB = "import os\nwhile True:\n    os.fork()\n"

# Delete everything in its working directory, then write a file into every directory it can reach: /tmp,
# the parents of its working directory, the repository.
WRITE_EVERYWHERE = f'''import os, shutil, helpers
for name in os.listdir("."):
    shutil.rmtree(name, ignore_errors=True)
repo = os.path.dirname(os.path.dirname(helpers.__file__))
targets, wrote = ["/tmp", repo, repo + "/helpers", repo + "/labs", "/"], []
path = os.getcwd()
while path != "/":
    path = os.path.dirname(path)
    targets.append(path)
for top in ["/tmp", os.path.dirname(os.path.dirname(os.getcwd()))]:
    targets += [root for root, _, _ in os.walk(top)][:200]
for d in targets:
    try:
        open(os.path.join(d, "{MARKER}-pwned"), "w").write("x")
        wrote.append(d)
    except OSError:
        pass
print("WROTE", wrote)
''' + lab.ADD

# Everything /proc shows (the grader's command line or environment would leak paths and the probe seed), then
# kill the kernel's parent: outside a PID namespace, that is the grader's process for this student.
READ_PROC = '''import os, signal
seen = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        seen.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
        seen.append(open(f"/proc/{pid}/environ", "rb").read().replace(b"\\0", b" ").decode())
    except OSError:
        pass
print("PROCS", len(seen) // 2, seen)
os.kill(os.getppid(), signal.SIGKILL)
''' + lab.ADD

# 4 MB: four times the grader's cap, and more than test_huge_output_is_cut allows the executed notebook (3 MB),
# so an uncut output fails it. 30 MB cost 3.6 s of the cell's limit on a loaded machine.
HUGE_OUTPUT = "import sys\nfor _ in range(8):\n    sys.stdout.write('x' * 500_000 + '\\n')\n" + lab.ADD


# 272 MiB into each tmpfs of the sandbox (RAM that `prlimit --as` does not count): /tmp and /dev/shm wrote it before
# their cap; the working directory and TMPDIR, on the grader's disk, too before they became capped tmpfs.
FILLS_TMPFS = '''import os
for d in ("/tmp", "/dev/shm", os.getcwd(), os.environ["TMPDIR"]):
    try:
        with open(os.path.join(d, "big"), "wb") as f:
            for _ in range(17):
                f.write(b"x" * 2**24)
        print(d, "WROTE 272 MiB")
    except OSError as e:
        print(d, "REFUSED", e.strerror)
''' + lab.ADD

# Called by the probe cell, the answer reads the cell's source (its nonce) from In and displays a result of its
# own before the probe's: the first one was graded (2/2 while rank_sum returns 0). Displays are no longer read: the
# probes' values come by the grader's pipe (run/channel.py).
FORGES_PROBE_RESULT = '''import ast, re
from IPython.display import display
def rank_sum(world_size):
    question, _, calls, nonce, _ = ast.literal_eval(re.search(r"_probe_run(\\(.*\\))", In[-1]).group(1))
    display({"application/vnd.dp-course.probe+json": {"question": question, "nonce": nonce,
             "results": [{"name": name, "value": 3.0} for name, _ in calls]}}, raw=True)
    return 0.0
'''


def _duplicate_answer_id(nb):
    """Two cells with the id of answer 97.1: a wrong one first, the right one second."""
    first = nbformat.from_dict(nb.cells[2])
    first.source = WRONG_ADD
    nb.cells[2].source = lab.ADD
    nb.cells.insert(2, first)


HOSTILE = {
    "daemon": (DAEMON, lab.RANK_SUM, None, 2, 2, "ok"),
    "finds_solution": (WRONG_ADD + FIND_SOLUTION, WRONG_SUM, None, 0, 0, "ok"),
    "ignores_sigint": (IGNORE_SIGINT, lab.RANK_SUM, None, 0, 2, "timeout"),
    "fork_bomb": (FORK_BOMB, lab.RANK_SUM, None, 0, 2, "error"),
    "writes_everywhere": (WRITE_EVERYWHERE, lab.RANK_SUM, None, 2, 2, "ok"),
    "reads_proc_kills_grader": (READ_PROC, lab.RANK_SUM, None, 2, 2, "ok"),
    "huge_output": (HUGE_OUTPUT, lab.RANK_SUM, None, 2, 2, "ok"),
    # nbformat renames the second id when it reads the notebook: the first cell is the graded one.
    "duplicate_ids": (None, lab.RANK_SUM, _duplicate_answer_id, 0, 2, "ok"),
    # 97.2 uses `In`, which the source scan refuses; its displayed result is not read.
    "fills_tmpfs_forges_probe": (FILLS_TMPFS, FORGES_PROBE_RESULT, None, 2, 0, "ok"),
}


# Everything a probe's call can reach, printed and raised (issue 29). The 97.1 cell prints what the kernel holds before
# any hidden test ran (its command line, environment, files); `add`, called by 97.1's probes, prints its locals and
# raises its own arguments: the probe's inputs, the question's seed among them ("adds integers"). Nothing in it is a
# name the source scan refuses, so its messages are quoted: withheld, or masked. The 97.2 cell reads the probe cell
# through the kernel's history (`In`) and the stack (its frames' locals: the private setup, nonce, seed), prints it,
# and raises it in pieces of 15 characters (no window of 16 in a row, no line of 24), from `rank_sum` under 97.2's
# probe and from the cell itself after 97.1's: the scan refuses those names, so nothing they raise is quoted.
LEAKS_INPUTS = '''import os, sys, traceback
import torch
print(sys.argv, dict(os.environ))
for path in sys.argv[1:] + [traceback.__file__]:
    try:
        print(open(path).read()[:200])
    except OSError as exc:
        print(exc)

def add(a, b):
    print(locals())
    if a.dtype != torch.float32:
        raise ValueError(a, b)
    raise RuntimeError(f"inputs {a.tolist()} {b.tolist()}")
'''
LEAKS_PROBE_CELL = '''import inspect, traceback

def rank_sum(world_size):
    traceback.print_stack()
    frames = inspect.stack()
    seen = In[-1] + " ".join(str(f.frame.f_locals.get(k)) for f in frames for k in ("setup", "nonce", "seed"))
    print([f.code_context for f in frames], seen)
    raise RuntimeError(" ".join(seen[i:i + 15] for i in range(0, len(seen), 15)))

earlier = [cell for cell in In if cell.startswith("from helpers.grading.run")]
raise RuntimeError(repr(earlier[-1]) + " ".join(earlier[-1][i:i + 15] for i in range(0, 400, 15)))
'''
HOSTILE["leaks_probe_and_inputs"] = (LEAKS_INPUTS, LEAKS_PROBE_CELL, None, 0, 0, "error")

# A route of IPython's display that the probe runtime's restore list does not name (issue 29): 97.2's answer replaced
# IPython.core.display_functions.publish_display_data, which display() calls, with a fake that rewrites the probe's
# values and keeps its nonce. Graded on the displayed result: 4/4 while rank_sum returns 0. Its store goes through a
# parameter, which the scan cannot trace to a library (`shown.publish_display_data = ...` it refuses:
# tests/grading/test_probes.py): the pipe the values now travel by is the fence here (run/channel.py).
PATCHES_DISPLAY = WRONG_SUM + '''
import IPython.core.display_functions as shown
publish = shown.publish_display_data
def rewrite(data, *args, **kwargs):
    for row in data.get("application/vnd.dp-course.probe+json", {}).get("results", []):
        row.pop("error", None)
        row["value"] = 3.0
    return publish(data, *args, **kwargs)
def install(module, name, fake):
    module.publish_display_data = fake
install(shown, "publish_display_data", rewrite)
'''
HOSTILE["patches_display"] = (lab.ADD, PATCHES_DISPLAY, None, 2, 0, "ok")
