"""A student's first session, from `make lab` to a saved answer, in a throwaway copy of the repository.

`make lab` runs there as a student runs it on a headless machine (here as root): it must pass --no-browser (and
--allow-root), not reinstall the venv, print a URL whose path opens chapter 00, and serve the whole checkout, labs
included. Then, in headless Chromium: that URL shows chapter 00; the file browser goes from chapters/ to the root
and into labs/; a double click opens lab 03; the released solution of 3.1 is typed over its TODO, the cells it
needs run, its check passes in the page; Ctrl+S saves; after a reload the answer and the passing check are still
there, in the page and on disk. Last, stopping make's process group ends every process it started.

One `make lab` serves all the tests of this file (they run in order, on one pytest-xdist worker: loadscope).
Screenshots: artifacts/journey/. The journey skips (never fails) without Chromium or playwright;
DP_COURSE_CHROMIUM picks the browser. Under make test the server's kernels are forks of the worker's warm zygote
(tests/warm_kernels.py), set through the environment only; without the plugin they start the usual way, and the
kernel importing `helpers` from the copy's labs/ folder is the real path.
"""
import json
import os
import pathlib
import re
import socket
import subprocess
import urllib.parse

import nbformat
import pytest

from helpers.grading.prepare.labgen import BEGIN, END
from tests.browser_lab import (
    NOTEBOOK,
    MakeLab,
    code_cell,
    copy_checkout,
    error_texts,
    launch_chromium,
    open_notebook,
    run_menu,
)
from tests.warm_kernels import WARM_KERNEL, kernel_name, zygote

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "journey"
CHROMIUM = os.environ.get("DP_COURSE_CHROMIUM", "/usr/bin/chromium")
CHAPTER = "chapters/00_first_distributed_program.ipynb"
LAB = "labs/03_manual_ddp.ipynb"
SOLUTION = ROOT / "solutions" / "03_manual_ddp.ipynb"
QUESTION = "3.1"
# 3.1's check runs in the kernel (no ranks); the lab's first cells import torch: ~20 s on 2 loaded cores, cold
CELL_TIMEOUT_MS = 120_000

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def made_lab(tmp_path_factory):
    """`make lab` in a copy of the repository's tracked files; stopped with everything it started."""
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    # make -q: exit 0 when the target is up to date, so `make lab` will not reinstall the venv
    fresh = subprocess.run(["make", "-q", "setup"], cwd=checkout, capture_output=True, timeout=60)
    assert fresh.returncode == 0, "the venv is older than pyproject.toml: run `make setup` first"
    warm = zygote().path if kernel_name() == WARM_KERNEL else None  # make test: fork the kernels
    lab = MakeLab(checkout, tmp_path_factory.mktemp("jupyter"), zygote=warm)
    try:
        yield lab.start()
    finally:
        leftovers = lab.stop()
        assert not leftovers, f"processes outlived make lab's SIGTERM (killed): {leftovers}"


def contents(lab, path):
    """GET /api/contents/<path>: (status, the model as a dict, or {})."""
    status, body = lab.get(lab.api(f"contents/{path}"))
    return status, json.loads(body) if status == 200 else {}


def title(notebook):
    """The text of a notebook's first heading, e.g. '00 · Your first distributed program'."""
    first = next(cell for cell in notebook.cells if cell.cell_type == "markdown")
    return re.match(r"#\s+(.+)", first.source)[1].strip()


@pytest.mark.timeout(150)
def test_make_lab_prints_the_url_of_chapter_00(made_lab):
    printed = made_lab.log_text()
    command = next((ln for ln in printed.splitlines() if ln.startswith("+") and "jupyter lab" in ln), "")
    assert "--no-browser" in command, f"no display: make lab must pass --no-browser; it printed:\n{printed}"
    if os.geteuid() == 0:  # the server ran as root, so jupyter accepted it; this is why
        assert "--allow-root" in command, f"as root make lab must pass --allow-root; it printed:\n{printed}"
    assert "pip install" not in printed, f"make lab reinstalled the venv:\n{printed}"
    url = urllib.parse.urlsplit(made_lab.url)
    assert url.path == f"/lab/tree/{CHAPTER}", f"the printed URL {made_lab.url} does not open {CHAPTER}"
    status, page = made_lab.get(made_lab.url)
    # JupyterLab's page, told which file to open (its page config's treePath)
    assert status == 200 and b"<title>JupyterLab" in page, (status, page[:300])
    assert f'"treePath": "{CHAPTER}"'.encode() in page, f"the page of {made_lab.url} opens no {CHAPTER}"
    status, notebook = contents(made_lab, CHAPTER)
    assert status == 200 and notebook["type"] == "notebook", (status, notebook)
    chapter = nbformat.from_dict(notebook["content"])
    assert title(chapter) == title(nbformat.read(ROOT / CHAPTER, as_version=4)), "another chapter 00 was served"


@pytest.mark.timeout(150)
def test_make_lab_serves_labs_and_chapters(made_lab):
    status, lab = contents(made_lab, LAB)
    assert status == 200 and lab["type"] == "notebook", f"GET /api/contents/{LAB}: {status}"
    for folder in ("chapters", "labs"):
        status, listing = contents(made_lab, folder)
        assert status == 200 and listing["type"] == "directory", f"GET /api/contents/{folder}: {status}"
        served = {item["name"] for item in listing["content"] if item["type"] == "notebook"}
        assert served == {p.name for p in (made_lab.checkout / folder).glob("*.ipynb")}, served


def solution_answer(question):
    """The id of the solution's cell answering `question`, its code for it (the lines between its markers), and
    the whole cell's source with only the marker lines removed: the lab's cell once the answer replaces its TODO."""
    for cell in nbformat.read(SOLUTION, as_version=4).cells:
        lines = cell.source.splitlines()
        begins = [i for i, line in enumerate(lines) if BEGIN.match(line) and BEGIN.match(line)["q"] == question]
        if begins:
            end = next(i for i in range(begins[0], len(lines)) if END.match(lines[i]))
            answer = "\n".join(lines[begins[0] + 1:end])
            whole = "\n".join(line for line in lines if not (BEGIN.match(line) or END.match(line)))
            return cell.id, answer, whole
    raise LookupError(f"no region of lab {question} in {SOLUTION.name}")


def cell_by_id(notebook_path, cell_id):
    return next(c for c in nbformat.read(notebook_path, as_version=4).cells if c.get("id") == cell_id)


def check_cell(notebook_path, question):
    source = f'check("{question}", globals())'
    return next(c for c in nbformat.read(notebook_path, as_version=4).cells if c.source.strip() == source)


def output_text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium with a fresh profile; skips without Chromium or playwright."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set DP_COURSE_CHROMIUM)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        context = launch_chromium(playwright, CHROMIUM, tmp_path / "chromium-profile")
        context.set_default_timeout(30_000)  # a click or a locator; generous on 2 loaded cores
        expect.set_options(timeout=30_000)  # an assertion's wait (5 s by default)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser):
    """A tab in it, closed afterwards."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab = browser.new_page()
    yield tab
    tab.close()


@pytest.mark.timeout(300)
def test_journey_from_make_lab_to_a_saved_answer(made_lab, page):
    from playwright.sync_api import expect

    cell_id, answer, answered = solution_answer(QUESTION)
    first_line = answered.splitlines()[0]  # "def shard_indices(...":  how the page's cell is found
    code_ids = [c.id for c in nbformat.read(ROOT / LAB, as_version=4).cells if c.cell_type == "code"]
    code_cells_above = code_ids.index(cell_id)
    check_text = re.compile(rf"{re.escape(QUESTION)}: (\d+)/\1 public checks passed")
    try:
        # The printed URL opens chapter 00, and its kernel connects.
        with page.expect_websocket(lambda ws: "/api/kernels/" in ws.url, timeout=60_000):
            page.goto(made_lab.url)
        chapter_title = title(nbformat.read(ROOT / CHAPTER, as_version=4))
        expect(page.locator(f"{NOTEBOOK} h1").first).to_contain_text(chapter_title)
        expect(page.locator(f"{NOTEBOOK} .jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1)
        page.screenshot(path=ARTIFACTS / "1_chapter_00.png")

        # The file browser shows chapters/; its home breadcrumb goes to the root, where labs/ is.
        folder_icon = page.get_by_role("tab", name=re.compile("^File Browser"))
        if folder_icon.get_attribute("aria-selected") != "true":  # the file browser is closed: open it
            folder_icon.click()
        files = page.locator(".jp-FileBrowser")
        expect(files.locator(".jp-BreadCrumbs-item[data-path='chapters']")).to_be_visible()
        files.locator(".jp-BreadCrumbs-home").click()
        labs = files.locator(".jp-DirListing-item", has=page.locator(".jp-DirListing-itemText",
                                                                     has_text=re.compile("^labs$")))
        labs.dblclick()
        expect(files.locator(".jp-BreadCrumbs-item[data-path='labs']")).to_be_visible()
        expect(files.locator(".jp-DirListing-itemText", has_text=pathlib.Path(LAB).name)).to_be_visible()
        page.screenshot(path=ARTIFACTS / "2_file_browser_labs.png")

        # A double click opens lab 03; its kernel connects.
        open_notebook(page, pathlib.Path(LAB).name)
        assert urllib.parse.urlsplit(page.url).path == f"/lab/tree/{LAB}", page.url
        todo = code_cell(page, first_line)
        expect(todo).to_have_count(1)
        expect(todo).to_contain_text(f'raise NotImplementedError("lab {QUESTION}")')

        # The cells 3.1 needs (install, parameters, imports, an example): Run > Run All Above Selected Cell. They
        # run in order; the last one's count ends the wait.
        todo.locator(".jp-InputPrompt").click()
        run_menu(page, "Run All Above Selected Cell")
        above = page.locator(f"{NOTEBOOK} .jp-CodeCell").nth(code_cells_above - 1)
        expect(above.locator(".jp-InputPrompt")).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=CELL_TIMEOUT_MS)
        assert error_texts(page) == [], "a cell above 3.1 failed (the kernel could not import helpers?)"

        # Type the answer over the TODO: select its two lines (the end of the cell), insert the solution's code.
        todo.locator(".cm-content").click()
        for key in ("Control+End", "Shift+ArrowUp", "Shift+Home"):
            page.keyboard.press(key)
        selected = page.evaluate("() => window.getSelection().toString()")
        assert selected.startswith(f"# TODO(lab {QUESTION})") and selected.endswith(
            f'raise NotImplementedError("lab {QUESTION}")'), f"selected instead of the TODO: {selected!r}"
        page.keyboard.insert_text(answer.lstrip())  # the cursor stands after the first line's indentation
        expect(todo).not_to_contain_text("NotImplementedError")

        # Shift+Enter runs the answer and moves to its check cell; Shift+Enter again runs the check.
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        check = code_cell(page, f'check("{QUESTION}", globals())')
        expect(check.locator(".jp-OutputArea")).to_contain_text(check_text, timeout=CELL_TIMEOUT_MS)
        assert "[FAIL]" not in check.locator(".jp-OutputArea").inner_text()
        assert error_texts(page) == []
        check.scroll_into_view_if_needed()
        page.screenshot(path=ARTIFACTS / "3_check_passed.png")

        # Ctrl+S saves: the tab is no longer marked as modified, and the file holds the answer and the check's pass.
        page.keyboard.press("Control+s")
        tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")
        expect(tab).to_contain_text(pathlib.Path(LAB).name)
        expect(tab).not_to_have_class(re.compile(r"\bjp-mod-dirty\b"))
        saved = made_lab.checkout / LAB
        assert cell_by_id(saved, cell_id).source == answered, "the saved cell is not the answer typed"
        assert check_text.search(output_text(check_cell(saved, QUESTION))), "the check's pass was not saved"

        # After a reload, the page shows the saved answer and the check's saved output.
        page.reload()
        todo = code_cell(page, first_line)
        expect(todo).to_contain_text(answer.strip().splitlines()[-1].strip(), timeout=60_000)
        expect(todo).not_to_contain_text("NotImplementedError")
        check = code_cell(page, f'check("{QUESTION}", globals())')
        expect(check.locator(".jp-OutputArea")).to_contain_text(check_text)
        todo.scroll_into_view_if_needed()
        page.screenshot(path=ARTIFACTS / "4_after_reload.png")
    except BaseException:
        page.screenshot(path=ARTIFACTS / "failed.png")
        raise
    todo_here = cell_by_id(ROOT / LAB, cell_id).source
    assert todo_here != answered and f"lab {QUESTION}" in todo_here, f"the journey wrote into the repository's {LAB}"


@pytest.mark.timeout(120)
def test_stopping_make_lab_ends_everything_it_started(made_lab):
    leftovers = made_lab.stop()
    assert not leftovers, f"processes outlived the SIGTERM to make's process group (killed): {leftovers}"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", made_lab.port), timeout=2).close()
