"""The memory calculator, headless: its numbers, label and drawn bars must equal helpers.theory's."""
import importlib

import matplotlib

matplotlib.use("Agg")  # headless, before anything can pick an interactive backend

import pytest  # noqa: E402
from ipywidgets.widgets.widget import _instances  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from helpers import widgets  # noqa: E402
from helpers.theory import GB, strategy_memory, zero_memory  # noqa: E402
from helpers.widgets import STRATEGY_LABELS, MemoryCalculator  # noqa: E402


def drawn_stacks(calc):
    """{category: [bar heights]} and {category: [bar bottoms]} read back from the matplotlib patches."""
    containers = {c.get_label(): c for c in calc.ax.containers}
    heights = {name: [p.get_height() for p in c] for name, c in containers.items()}
    bottoms = {name: [p.get_y() for p in c] for name, c in containers.items()}
    return heights, bottoms


def budget_lines(calc):
    """y values of the horizontal budget lines on the axes."""
    return [line.get_ydata()[0] for line in calc.ax.get_lines() if isinstance(line, Line2D)]


@pytest.fixture
def calc():
    return MemoryCalculator(params_billion=7.5, dp=64, strategy="ZeRO-3", budget_gb=32)


def test_import_has_no_side_effects():
    before_widgets = len(_instances)
    before_figures = matplotlib._pylab_helpers.Gcf.get_num_fig_managers()
    importlib.reload(widgets)
    assert len(_instances) == before_widgets
    assert matplotlib._pylab_helpers.Gcf.get_num_fig_managers() == before_figures


def test_default_reproduces_zero_figure_1(calc):
    bars = calc.bars()
    assert list(bars) == list(STRATEGY_LABELS)
    expected = {"DDP": 120, "ZeRO-1": 31.40625, "ZeRO-2": 16.640625, "ZeRO-3": 1.875,
                "NO_SHARD": 120, "SHARD_GRAD_OP": 16.640625, "FULL_SHARD": 1.875,
                "HYBRID_SHARD": zero_memory(7.5e9, 8, 3)["total"] / GB}
    assert {label: b["total"] for label, b in bars.items()} == pytest.approx(expected)
    assert calc.total_label.value.startswith("ZeRO-3: 1.88 GB per device")
    assert "fits in the 32 GB budget" in calc.total_label.value


def test_drawn_bars_are_the_numbers(calc):
    bars = calc.bars()
    heights, bottoms = drawn_stacks(calc)
    for name in ("params", "grads", "optimizer"):
        assert heights[name] == pytest.approx([b[name] for b in bars.values()])
    # Stacked: grads start on top of params, optimizer on top of both.
    assert bottoms["grads"] == pytest.approx(heights["params"])
    assert bottoms["optimizer"] == pytest.approx([p + g for p, g in zip(heights["params"],
                                                                           heights["grads"])])
    assert budget_lines(calc) == [32]


def test_controls_update_numbers_figure_and_label(calc):
    png_before = calc.image.value
    calc.controls["params_billion"].value = 14  # observers redraw
    zero2 = strategy_memory(14e9, 64, "zero2")
    assert calc.bars()["ZeRO-2"]["total"] == pytest.approx(zero2["total"] / GB)  # 31.0625
    heights, _ = drawn_stacks(calc)
    assert heights["optimizer"][2] == pytest.approx(zero2["optimizer"] / GB)
    assert calc.total_label.value.startswith("ZeRO-3: 3.50 GB per device")
    assert bytes(calc.image.value) != bytes(png_before)
    assert bytes(calc.image.value).startswith(b"\x89PNG")


def test_budget_verdict_and_line(calc):
    with calc.hold_updates():
        calc.controls["strategy"].value = "DDP"
        calc.controls["budget_gb"].value = 80
    assert "exceeds the 80 GB budget" in calc.total_label.value
    assert budget_lines(calc) == [80]
    calc.controls["budget_gb"].value = 0  # 0 = no budget
    assert budget_lines(calc) == [] and "budget" not in calc.total_label.value


def test_optimizer_and_convention_set_bytes_per_param(calc):
    with calc.hold_updates():
        calc.controls["compare_all"].value = False
        calc.controls["strategy"].value = "DDP"
        calc.controls["optimizer"].value = "SGD + momentum"  # fp32 master + momentum: K = 8
    assert calc.bars() == {"DDP": pytest.approx(
        {k: v / GB for k, v in zero_memory(7.5e9, 64, 0, k=8).items()})}
    assert "(2+2+8 bytes/param" in calc.total_label.value
    with calc.hold_updates():
        calc.controls["optimizer"].value = "Adam"
        calc.controls["convention"].value = "fp32_adam"  # no master copy: 4 + 4 + 8
    assert calc.settings()["k"] == 8
    assert calc.bars()["DDP"]["total"] == pytest.approx(16 * 7.5)
    heights, _ = drawn_stacks(calc)
    assert heights["params"] == pytest.approx([4 * 7.5])


def test_hybrid_shard_group_size(calc):
    with calc.hold_updates():
        calc.controls["dp"].value = 12  # group size 8 does not divide 12
    assert "HYBRID_SHARD" not in calc.bars()
    assert "HYBRID_SHARD hidden" in calc.total_label.value
    calc.controls["strategy"].value = "HYBRID_SHARD"
    assert calc.total_label.value.startswith("Cannot compute: group_size=8 must divide world_size=12")
    with pytest.raises(ValueError, match="must divide"):
        calc.bars()
    calc.controls["group_size"].value = 4
    assert calc.bars()["HYBRID_SHARD"] == pytest.approx(
        {k: v / GB for k, v in zero_memory(7.5e9, 4, 3).items()})
    assert calc.total_label.value.startswith("HYBRID_SHARD: 30.00 GB per device")


def test_displays_as_a_widget(calc):
    bundle = calc._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
