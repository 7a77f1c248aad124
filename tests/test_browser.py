"""The course in a real browser: JupyterLab in headless Chromium runs chapter 00, the appendix and a lab.

What a student sees, checked in the page: `%%ranks` prints one line per rank, the memory calculator
renders and its total follows its controls, and no cell fails; in lab 03, a right answer, a wrong one
and one that deadlocks each get their feedback once, in lines short enough not to break mid-word.
Screenshots go to artifacts/browser/.
Skips (never fails) without Chromium or the playwright package; DP_COURSE_CHROMIUM picks the browser.
"""
import os
import pathlib
import re

import nbformat
import pytest

from tests.browser_lab import (
    NOTEBOOK,
    Lab,
    close_notebook,
    copy_clean,
    error_texts,
    feedback_notebook,
    launch_chromium,
    open_lab,
    open_notebook,
    run_all_cells,
    wait_until_run,
)
from tests.warm_kernels import WARM_KERNEL, kernel_name, zygote

CHROMIUM = os.environ.get("DP_COURSE_CHROMIUM", "/usr/bin/chromium")
if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set DP_COURSE_CHROMIUM)",
                allow_module_level=True)
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pytest.skip("playwright is not installed: pip install -e '.[dev]'", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "browser"
CHAPTER_00 = ROOT / "chapters" / "00_first_distributed_program.ipynb"
APPENDIX = ROOT / "chapters" / "99_appendix_instruments.ipynb"  # holds the MemoryCalculator
FEEDBACK = "03_feedback.ipynb"  # lab 03's imports, then a right, a wrong and a deadlocking answer with checks
RUN_TIMEOUT_S = 180  # a whole notebook on 2 loaded cores; chapter 00 alone takes ~20 s

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving clean copies of the two notebooks; stopped with every process it started."""
    root = tmp_path_factory.mktemp("notebooks")
    # Each notebook up to the cell under test: nbval runs the whole chapters; here the point is the page.
    copy_clean(CHAPTER_00, root, through="%%ranks")
    copy_clean(APPENDIX, root, through="from helpers.widgets import MemoryCalculator")
    feedback_notebook(root / FEEDBACK)
    # make test: the kernels are forks of this worker's zygote (tests/warm_kernels.py), not started anew
    warm = zygote().path if kernel_name() == WARM_KERNEL else None
    server = Lab(root, tmp_path_factory.mktemp("jupyter"), zygote=warm)
    try:
        yield server.start()
    finally:
        leftovers = server.stop()
        assert not leftovers, f"processes outlived the server's shutdown (killed): {leftovers}"


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    """Headless Chromium with a fresh profile, closed at the end."""
    with sync_playwright() as playwright:
        context = launch_chromium(playwright, CHROMIUM, tmp_path_factory.mktemp("chromium-profile"))
        context.set_default_timeout(30_000)  # a click or a locator; generous on 2 loaded cores
        expect.set_options(timeout=30_000)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def app(browser, lab):
    """One tab with JupyterLab loaded once for the module: a load costs ~5 CPU-s (Chromium compiling its
    scripts, the server sending them), so each test opens its notebook in it from the file browser."""
    tab = browser.new_page()
    try:
        open_lab(tab, lab)
        yield tab
    finally:
        tab.close()


@pytest.fixture
def page(app, lab, request):
    """The JupyterLab tab; a screenshot of it when the test failed; afterwards the test's notebook is closed
    (JupyterLab is loaded afresh after a failure) and its kernels shut down."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    failed_before = request.session.testsfailed
    try:
        yield app
    finally:
        if request.session.testsfailed > failed_before:
            app.screenshot(path=ARTIFACTS / f"{request.node.name}_failed.png")
            open_lab(app, lab)  # whatever state the page was left in (a dialog, a cell running), not the next test's
        else:
            close_notebook(app)
        lab.shutdown_kernels()  # one notebook's ranks at a time on 2 cores


def run_notebook(page, name):
    """Open a notebook, Run All Cells, wait for the end; assert no cell failed and every cell ran."""
    open_notebook(page, name)
    run_all_cells(page)
    done = wait_until_run(page, RUN_TIMEOUT_S)
    assert error_texts(page) == [], f"{name}: a cell failed"
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in done), f"{name}: cells not run: {done}"


def code_cell(page, starting_with):
    """The code cell whose source starts with the given text."""
    source = re.compile("^" + re.escape(starting_with))
    editor = page.locator(".cm-content", has_text=source)
    return page.locator(f"{NOTEBOOK} .jp-CodeCell").filter(has=editor)


def test_chapter_00_ranks_cell(page):
    run_notebook(page, CHAPTER_00.name)
    cell = code_cell(page, "%%ranks")
    expect(cell).to_have_count(1)
    # The parameters cell sets WORLD_SIZE; the %%ranks cell prints one hello per rank, prefixed.
    sources = "\n".join(c.source for c in nbformat.read(CHAPTER_00, as_version=4).cells)
    world_size = int(re.search(r"^WORLD_SIZE = (\d+)", sources, re.M).group(1))
    output = cell.locator(".jp-OutputArea").inner_text()
    for rank in range(world_size):
        assert f"[rank {rank}] hello from rank {rank} of {world_size}" in output, output
    assert f"[rank {world_size}]" not in output
    cell.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "00_ranks_cell.png")


def total_gb(label_text):
    """The selected strategy's total from the calculator's label, e.g. 'ZeRO-3: 1.88 GB per device'."""
    return float(re.search(r": ([\d.]+) GB per device", label_text).group(1))


def test_memory_calculator_widget(page):
    run_notebook(page, APPENDIX.name)
    cell = code_cell(page, "from helpers.widgets import MemoryCalculator")
    widget = cell.locator(".jp-OutputArea .widget-vbox").first
    expect(widget).to_be_visible()
    expect(widget.locator("select")).not_to_have_count(0)         # the strategy, convention, ...
    image = widget.locator("img")
    expect(image).to_have_count(1)                                # the bars, a PNG
    total = widget.locator(".widget-label", has_text="GB per device")
    expect(total).to_have_count(1)
    widget.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "99_calculator.png")

    # Twice the parameters: every strategy's model state doubles, so must the total shown.
    params = widget.locator(".widget-text", has_text="parameters (billions)").locator("input")
    before_text, before_image = total.inner_text(), image.get_attribute("src")
    before, before_params = total_gb(before_text), float(params.input_value())
    params.fill(f"{2 * before_params:g}")
    params.press("Enter")  # BoundedFloatText sends its value on Enter or blur
    expect(total).not_to_have_text(before_text)
    after = total_gb(total.inner_text())
    assert after == pytest.approx(2 * before, abs=0.02), (before, after)
    expect(image).not_to_have_attribute("src", before_image)      # the bars were redrawn too
    image.evaluate("img => img.decode()")                         # ... and are on screen
    page.screenshot(path=ARTIFACTS / "99_calculator_changed.png")


def output_of(page, starting_with):
    """The text of the output area of the code cell whose source starts with the given text."""
    cell = code_cell(page, starting_with)
    expect(cell).to_have_count(1)
    return cell, cell.locator(".jp-OutputArea").inner_text()


def test_lab_feedback_right_wrong_and_deadlock(page):
    run_notebook(page, FEEDBACK)
    cell, right = output_of(page, "# right")
    assert "3.1: 6/6 public checks passed." in right and "[FAIL]" not in right, right
    assert "CheckResult(" not in right, f"the result's repr follows the summary:\n{right}"
    cell.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "03_right_answer.png")

    cell, wrong = output_of(page, "# wrong")
    first = wrong.strip().splitlines()[0]
    assert first.startswith("[FAIL] 3.3") and "SUM" in wrong and "divide by the world size" in wrong, wrong
    cell.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "03_wrong_answer.png")

    cell, hang = output_of(page, "# deadlock")
    assert hang.count("Launcher's report") == 1 and hang.count("deadlock: rank 1 returned") == 1, hang
    assert "[SKIP] 3.3" in hang and "count a missing .grad as zeros" in hang, hang
    cell.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "03_deadlock.png")
    # Short lines: JupyterLab breaks a longer line anywhere, mid-word included.
    for text in (right, wrong, hang):
        assert max(len(line) for line in text.splitlines()) <= 88, text
