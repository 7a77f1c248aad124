"""helpers.plot: what each figure draws, checked on the artists."""
import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from helpers.plot import (  # noqa: E402
    COMPUTE_COLOUR,
    curves,
    memory_bars,
    palette,
    pipeline,
    scaling_curve,
    timeline,
)

T0 = 1000.0  # perf_counter-like origin: the plot must subtract it
SPANS = [
    {"rank": 0, "start": T0 + 0.000, "end": T0 + 0.010, "kind": "compute", "label": "backward"},
    {"rank": 0, "start": T0 + 0.004, "end": T0 + 0.006, "kind": "comm", "label": "bucket 0"},
    {"rank": 0, "start": T0 + 0.008, "end": T0 + 0.012, "kind": "comm", "label": "bucket 1"},
    {"rank": 0, "start": T0 + 0.012, "end": T0 + 0.020, "kind": "compute", "label": "step"},
    {"rank": 1, "start": T0 + 0.001, "end": T0 + 0.011, "kind": "compute", "label": "backward"},
    {"rank": 1, "start": T0 + 0.005, "end": T0 + 0.007, "kind": "comm", "label": "bucket 0"},
    {"rank": 1, "start": T0 + 0.009, "end": T0 + 0.013, "kind": "comm", "label": "bucket 1"},
]


def _rects_by_row(fig):
    """{rank row: [(left, width, hex colour)]} from the bars drawn on the figure's first Axes."""
    rows = defaultdict(list)
    for patch in fig.axes[0].patches:
        row = round(patch.get_y() + patch.get_height() / 2)
        rows[row].append((patch.get_x(), patch.get_width(), to_hex(patch.get_facecolor())))
    return rows


def test_palette_is_deterministic_and_distinct():
    colours = palette(["bucket 0", "bucket 1", "bucket 0", "bucket 2"])
    assert list(colours) == ["bucket 0", "bucket 1", "bucket 2"]
    assert len(set(colours.values())) == 3
    assert colours == palette(["bucket 0", "bucket 1", "bucket 2"])
    assert len(set(palette(range(18)).values())) == 18
    assert to_hex(COMPUTE_COLOUR) not in {to_hex(c) for c in palette(range(18)).values()}


def test_timeline_draws_one_bar_per_span_per_rank_row():
    rows = _rects_by_row(timeline(SPANS))
    assert sorted(rows) == [0, 1]
    assert len(rows[0]) == 4 and len(rows[1]) == 3
    grey = to_hex(COMPUTE_COLOUR)
    assert sum(c == grey for _, _, c in rows[0]) == 2 and sum(c == grey for _, _, c in rows[1]) == 1


def test_timeline_colours_communication_by_label_and_normalises_time():
    fig = timeline(SPANS, unit="ms")
    rows = _rects_by_row(fig)
    by_left = {round(left, 6): colour for row in rows.values() for left, _, colour in row}
    # bucket 0 starts at 4 ms (rank 0) and 5 ms (rank 1); bucket 1 at 8 and 9 ms
    assert by_left[4.0] == by_left[5.0] != by_left[8.0] == by_left[9.0]
    assert min(by_left) == 0.0
    widths = sorted(round(w, 6) for row in rows.values() for _, w, _ in row)
    assert widths == [2.0, 2.0, 4.0, 4.0, 8.0, 10.0, 10.0]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["compute", "bucket 0", "bucket 1"]


def test_timeline_accepts_a_dict_per_rank():
    per_rank = defaultdict(list)
    for span in SPANS:
        per_rank[span["rank"]].append({k: v for k, v in span.items() if k != "rank"})
    assert _rects_by_row(timeline(dict(per_rank))) == _rects_by_row(timeline(SPANS))


def test_timeline_rejects_empty_input():
    with pytest.raises(ValueError, match="no spans"):
        timeline([])


ROWS = {
    "DDP": {"params": 2e9, "grads": 2e9, "optimizer": 12e9, "total": 16e9},
    "ZeRO-1": {"params": 2e9, "grads": 2e9, "optimizer": 3e9, "total": 7e9},
}


def test_memory_bars_stacks_each_category_in_the_chosen_unit():
    fig = memory_bars(ROWS, unit="GB", budget=8e9)
    bars = fig.axes[0].patches
    assert len(bars) == 6  # 2 strategies x 3 categories; 'total' is not a category
    heights = [round(b.get_height(), 9) for b in bars]
    assert heights == [2, 2, 2, 2, 12, 3]  # params (DDP, ZeRO-1), grads, optimizer
    tops = [round(b.get_y() + b.get_height(), 9) for b in bars[-2:]]
    assert tops == [16, 7]
    budget = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert len(budget) == 1 and list(budget[0].get_ydata()) == [8, 8]


def test_memory_bars_binary_units_and_unknown_unit():
    fig = memory_bars({"x": {"params": 2**20, "grads": 2**21}}, unit="MiB")
    assert [b.get_height() for b in fig.axes[0].patches] == [1.0, 2.0]
    with pytest.raises(ValueError, match="unit"):
        memory_bars(ROWS, unit="gigabytes")


def test_curves_draws_given_data_and_log_axes():
    fig = curves({"ours": ([1, 2, 4], [3.0, 2.0, 1.0]), "torch": [3.0, 2.5, 1.5]}, logx=True, logy=True)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["ours"].get_xdata()) == [1, 2, 4]
    assert list(lines["ours"].get_ydata()) == [3.0, 2.0, 1.0]
    assert list(lines["torch"].get_xdata()) == [0, 1, 2]
    assert lines["ours"].get_color() != lines["torch"].get_color()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="ours"):
        curves({"ours": ([1, 2], [1.0])})


def test_scaling_curve_strong_and_weak():
    ax = scaling_curve([1, 2, 4], [8.0, 5.0, 4.0]).axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"measured": [1.0, 1.6, 2.0], "ideal": [1.0, 2.0, 4.0]}
    ax = scaling_curve([1, 2, 4], [8.0, 10.0, 16.0], weak=True).axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"measured": [1.0, 0.8, 0.5], "ideal": [1.0, 1.0, 1.0]}


def test_figures_stay_out_of_pyplot_and_render_with_agg():
    plt.close("all")
    figs = [timeline(SPANS), memory_bars(ROWS), curves({"a": [1, 2]}), scaling_curve([1, 2], [2.0, 1.0])]
    assert plt.get_fignums() == []  # not pyplot-managed: a notebook shows a returned figure once
    for fig in figs:
        assert isinstance(fig, Figure)
        fig.savefig(io.BytesIO(), format="png")


def test_draws_into_a_given_axes():
    fig = Figure()
    ax = fig.add_subplot()
    assert curves({"a": [1, 2]}, ax=ax) is fig
    assert len(ax.get_lines()) == 1


def test_pipeline_draws_one_bar_per_action_coloured_by_micro_batch():
    spans = {0: [{"kind": "F", "mb": 0, "start": T0, "end": T0 + 0.001},
                 {"kind": "F", "mb": 1, "start": T0 + 0.001, "end": T0 + 0.002},
                 {"kind": "B", "mb": 0, "start": T0 + 0.004, "end": T0 + 0.006}],
             1: [{"kind": "F", "mb": 0, "start": T0 + 0.001, "end": T0 + 0.002},
                 {"kind": "B", "mb": 0, "start": T0 + 0.002, "end": T0 + 0.004}]}
    fig = pipeline(spans, title="GPipe")
    rows = _rects_by_row(fig)
    assert sorted(rows) == [0, 1] and len(rows[0]) == 3 and len(rows[1]) == 2
    assert rows[0][0][:2] == pytest.approx((0.0, 1.0)) and rows[0][2][:2] == pytest.approx((4.0, 2.0))  # ms from T0
    colours = palette([0, 1])
    assert [c for _, _, c in rows[0]] == [colours[0], colours[1], colours[0]]  # micro-batch 0's F and B alike
    hatched = [bool(patch.get_hatch()) for patch in fig.axes[0].patches]
    assert hatched == [True, True, False, True, False]  # forwards hatched
    assert [t.get_text() for t in fig.axes[0].texts] == ["F0", "F1", "B0", "F0", "B0"]


def test_pipeline_refuses_no_spans_and_a_bad_unit():
    with pytest.raises(ValueError, match="no spans"):
        pipeline([])
    with pytest.raises(ValueError, match="unit"):
        pipeline([{"rank": 0, "kind": "F", "mb": 0, "start": 0.0, "end": 1.0}], unit="h")
