"""Figures drawn from measured data: per-rank timelines, pipeline schedules, memory bars, curves.

Every function returns a matplotlib Figure and never calls plt.show(): figures are built with
`matplotlib.figure.Figure`, outside pyplot, so a notebook displays a returned figure exactly once,
nothing accumulates in pyplot's registry, and any backend (Agg in CI) works.
Pass `ax=` to draw into an existing Axes instead; the function then returns that Axes' figure.
"""
from collections.abc import Iterable, Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch

# tab10 without its grey (grey means compute), then tab20's light shades: 18 distinct colours.
_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5",
)
COMPUTE_COLOUR = "#9e9e9e"

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


def palette(keys: Iterable) -> dict:
    """One colour per distinct key (rank, bucket, op), in order of first appearance; repeats after 18."""
    colours = {}
    for key in keys:
        if key not in colours:
            colours[key] = _COLOURS[len(colours) % len(_COLOURS)]
    return colours


def _axes(ax, figsize):
    """The Axes to draw on: the caller's, or a new one on a pyplot-free Figure."""
    if ax is not None:
        return ax
    return Figure(figsize=figsize, layout="constrained").add_subplot()


def _flatten_spans(spans) -> list[dict]:
    """A list of span dicts from a list, or from {rank: [spans]} (the key fills a missing 'rank')."""
    if isinstance(spans, Mapping):
        return [{"rank": rank, **span} for rank, rows in spans.items() for span in rows]
    return list(spans)


def span_label(span: Mapping) -> str:
    """What a span is coloured by: its 'label', else its collective 'op', else its 'kind'."""
    return span.get("label") or span.get("op") or span.get("kind", "comm")


def _sublanes(spans) -> dict:
    """Greedy interval partitioning: id(span) -> sub-lane, so overlapping spans of a rank never hide each other."""
    lane_of, lane_ends = {}, {}
    for span in spans:  # sorted by start
        ends = lane_ends.setdefault(span["rank"], [])
        lane = next((i for i, end in enumerate(ends) if end <= span["start"]), len(ends))
        ends[lane:lane + 1] = [span["end"]]
        lane_of[id(span)] = lane
    return lane_of


def timeline(spans, *, ax=None, title: str | None = None, unit: str = "ms", figsize=(9, 3)):
    """Per-rank timeline: compute spans grey in the top lane, communication coloured by label below."""
    rows = [s for s in _flatten_spans(spans) if s.get("end") is not None]
    if not rows:
        raise ValueError("timeline: no spans with a start and an end to draw")
    if unit not in _TIME_UNITS:
        raise ValueError(f"timeline: unit {unit!r} is not one of {sorted(_TIME_UNITS)}")
    scale, t0 = _TIME_UNITS[unit], min(s["start"] for s in rows)
    rows.sort(key=lambda s: s["start"])  # colours follow first appearance in time: bucket 0 first
    comm = [s for s in rows if s.get("kind", "comm") != "compute"]
    colours = palette(span_label(s) for s in comm)
    ranks = sorted({s["rank"] for s in rows})
    ax = _axes(ax, figsize)
    # Two lanes per rank row: overlapping compute and communication (chapter 04) stay visible.
    # Collectives in flight at the same time (async buckets) split the comm lane into sub-lanes.
    lane_of = _sublanes(comm)
    depth = {r: 1 + max([lane_of[id(s)] for s in comm if s["rank"] == r], default=0) for r in ranks}
    for span in rows:
        is_compute = span.get("kind", "comm") == "compute"
        height = 0.38 if is_compute else 0.38 / depth[span["rank"]]
        y = ranks.index(span["rank"]) + (-0.2 if is_compute else 0.01 + height * (lane_of[id(span)] + 0.5))
        colour = COMPUTE_COLOUR if is_compute else colours[span_label(span)]
        ax.barh(y, (span["end"] - span["start"]) * scale, left=(span["start"] - t0) * scale,
                height=height, color=colour, edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 on top
    ax.set_xlabel(f"time ({unit}) from the first span")
    handles = [Patch(color=COMPUTE_COLOUR, label="compute")] if len(comm) < len(rows) else []
    handles += [Patch(color=c, label=str(label)) for label, c in colours.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    if title:
        ax.set_title(title)
    return ax.figure


def pipeline(spans, *, ax=None, title: str | None = None, unit: str = "ms", figsize=(10, 2.5)):
    """A pipeline schedule: one row per rank, one colour per micro-batch ('mb'), forwards ('kind' "F") hatched."""
    rows = _flatten_spans(spans)
    if not rows:
        raise ValueError("pipeline: no spans to draw; each needs rank, kind ('F' or 'B'), mb, start and end")
    if unit not in _TIME_UNITS:
        raise ValueError(f"pipeline: unit {unit!r} is not one of {sorted(_TIME_UNITS)}")
    scale, t0 = _TIME_UNITS[unit], min(s["start"] for s in rows)
    colours = palette(sorted({s["mb"] for s in rows}))
    ax = _axes(ax, figsize)
    for s in rows:
        forward = s["kind"] == "F"
        ax.barh(s["rank"], (s["end"] - s["start"]) * scale, left=(s["start"] - t0) * scale, height=0.8,
                color=colours[s["mb"]], alpha=0.5 if forward else 1.0, hatch="//" if forward else None,
                edgecolor="white", linewidth=0.5)
        ax.text(((s["start"] + s["end"]) / 2 - t0) * scale, s["rank"], f"{s['kind']}{s['mb']}",
                ha="center", va="center", fontsize=7)
    ranks = sorted({s["rank"] for s in rows})
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)  # rank 0 on top
    ax.set_xlabel(f"time ({unit}) from the first action")
    if title:
        ax.set_title(title, fontsize=10)
    return ax.figure


def memory_bars(rows: Mapping[str, Mapping[str, float]], *, unit: str = "GB",
                categories: Sequence[str] | None = None, budget: float | None = None,
                ax=None, title: str | None = None, figsize=(6, 4)):
    """Stacked bars of bytes per strategy (params / grads / optimizer), optional budget line in bytes."""
    if unit not in _UNITS:
        raise ValueError(f"memory_bars: unit {unit!r} is not one of {list(_UNITS)}")
    if categories is None:  # every key the rows use, 'total' excepted: state_bytes() output fits as is
        categories = list(dict.fromkeys(k for row in rows.values() for k in row if k != "total"))
    scale = _UNITS[unit]
    names = list(rows)
    ax = _axes(ax, figsize)
    bottoms = [0.0] * len(names)
    for category, colour in palette(categories).items():
        heights = [rows[name].get(category, 0) / scale for name in names]
        ax.bar(names, heights, bottom=bottoms, color=colour, label=category)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, total in enumerate(bottoms):
        ax.annotate(f"{total:.3g}", (x, total), ha="center", va="bottom", fontsize="small")
    if budget is not None:
        ax.axhline(budget / scale, color="black", linestyle="--", linewidth=1,
                   label=f"budget {budget / scale:.3g} {unit}")
    ax.set_ylabel(f"memory per rank ({unit})")
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return ax.figure


def _xy(values) -> tuple[list, list]:
    """(xs, ys) from an (xs, ys) pair or from ys alone (xs = 0, 1, 2, ...)."""
    if isinstance(values, tuple) and len(values) == 2 and all(hasattr(v, "__len__") for v in values):
        xs, ys = values
        return list(xs), list(ys)
    ys = list(values)
    return list(range(len(ys))), ys


def curves(series: Mapping[str, object], *, xlabel: str = "", ylabel: str = "",
           logx: bool = False, logy: bool = False, styles: Mapping[str, dict] | None = None,
           ax=None, title: str | None = None, figsize=(6, 4)):
    """One line per named series, each given as (xs, ys) or as ys; `styles` adds plot kwargs by name."""
    ax = _axes(ax, figsize)
    for (name, values), colour in zip(series.items(), palette(series).values()):
        xs, ys = _xy(values)
        if len(xs) != len(ys):
            raise ValueError(f"curves: series {name!r} has {len(xs)} x values and {len(ys)} y values")
        style = {"color": colour, "marker": "o" if len(xs) <= 12 else None, **(styles or {}).get(name, {})}
        ax.plot(xs, ys, label=name, **style)
    if logx:
        ax.set_xscale("log", base=2)  # world sizes and bucket sizes grow by doubling
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return ax.figure


def scaling_curve(world_sizes: Sequence[int], seconds: Sequence[float], *, weak: bool = False,
                  ax=None, title: str | None = None):
    """Measured vs ideal scaling from step times: speedup (strong) or efficiency (weak) per world size."""
    if len(world_sizes) != len(seconds) or not world_sizes:
        raise ValueError("scaling_curve: need one step time per world size, at least one")
    n0, t0 = world_sizes[0], seconds[0]
    measured = [t0 / t for t in seconds]  # strong: speedup; weak: efficiency (same work per rank)
    if weak:  # ideal: the step time stays flat as ranks are added
        ideal, ylabel = [1.0] * len(seconds), "weak-scaling efficiency"
    else:  # ideal: N times the ranks, N times faster
        ideal, ylabel = [n / n0 for n in world_sizes], "speedup"
    return curves({"measured": (world_sizes, measured), "ideal": (world_sizes, ideal)},
                  styles={"ideal": {"color": "black", "linestyle": "--", "marker": None}},
                  xlabel="world size (ranks)", ylabel=ylabel, ax=ax, title=title)
