"""What each rank holds before and after a collective, drawn from the tensors the ranks returned.

One row of cells per rank, one cell per element, the value written in the cell. A cell is coloured
by the rank its value came from (`source`), so a broadcast turns every row into rank 0's colour and
an all-gather lines the ranks' colours up side by side; values combined from every rank (a sum, a
mean) are grey. Figures are built with `matplotlib.figure.Figure`, outside pyplot, like helpers.plot.
"""
from collections.abc import Callable, Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from helpers.plot import palette

REDUCED_COLOUR = "#d0d0d0"  # a value no single rank owns: the reduction of all of them
REDUCED_LABEL = "combined from all ranks"


def as_rows(tensors: Sequence) -> list[list[float]]:
    """One flat list of numbers per rank, from tensors (any shape), lists or scalars."""
    rows = []
    for t in tensors:
        t = t.detach().cpu().flatten().tolist() if hasattr(t, "detach") else t
        rows.append([float(v) for v in t] if isinstance(t, (list, tuple)) else [float(t)])
    return rows


def source_of(source, rank: int, index: int):
    """The rank a value came from, or None when it combines every rank."""
    if source == "own":
        return rank
    if source == "reduced":
        return None
    if isinstance(source, int):
        return source
    if callable(source):
        return source(rank, index)
    raise ValueError(f"source={source!r}: use 'own', 'reduced', a rank (int) or a function (rank, index) -> rank")


def format_value(value: float, decimals: int) -> str:
    """'7' for whole numbers, '5.5' or '3.25' otherwise: rounded to `decimals` places, no trailing zeros."""
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def draw_rows(ax, rows, colours, source, decimals=2):
    """One row of labelled cells per rank on ax; returns the set of sources drawn (None: reduced)."""
    used = set()
    for rank, row in enumerate(rows):
        for index, value in enumerate(row):
            origin = source_of(source, rank, index)
            used.add(origin)
            colour = REDUCED_COLOUR if origin is None else colours[origin]
            ax.add_patch(Rectangle((index, rank), 1, 1, facecolor=colour, alpha=0.55,
                                   edgecolor="white", linewidth=2))
            ax.text(index + 0.5, rank + 0.5, format_value(value, decimals), ha="center", va="center",
                    fontsize="medium")
    return used


def style_panel(ax, rows, colours, title, chunk=None):
    """Rank 0 on top, y labels 'rank r' in the rank's colour, a line between pieces of `chunk` elements."""
    width = max((len(r) for r in rows), default=1)
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows), 0)
    for x in range(chunk or width, width, chunk or width):
        ax.axvline(x, color="black", linewidth=2)
    ax.set_yticks([r + 0.5 for r in range(len(rows))], [f"rank {r}" for r in range(len(rows))])
    for rank, label in enumerate(ax.get_yticklabels()):
        label.set_color(colours[rank])
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, fontsize="medium")


def stages_figure(stages: Mapping[str, Sequence], *, sources: Mapping[str, object] | None = None,
                  title: str | None = None, decimals: int = 2, chunk: int | None = None, cell_inches: float = 0.55):
    """Side-by-side panels {stage name: per-rank tensors}; `sources` colours each stage (default 'own')."""
    if not stages:
        raise ValueError("stages_figure: give at least one stage, e.g. {'before': xs, 'after': ys}")
    panels = {name: as_rows(tensors) for name, tensors in stages.items()}
    counts = {len(rows) for rows in panels.values()}
    if len(counts) != 1:
        raise ValueError(f"stages_figure: every stage needs one entry per rank, got {sorted(counts)} ranks")
    world_size = counts.pop()
    colours = palette(range(world_size))
    widths = [max((len(r) for r in rows), default=1) for rows in panels.values()]
    figsize = (1.2 + cell_inches * (sum(widths) + 1.2 * len(widths)), 0.9 + cell_inches * world_size)
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, len(panels), width_ratios=widths, squeeze=False)[0]
    used = set()
    for ax, (name, rows) in zip(axes, panels.items()):
        used |= draw_rows(ax, rows, colours, (sources or {}).get(name, "own"), decimals)
        style_panel(ax, rows, colours, name, chunk)
    if None in used:
        grey = Patch(facecolor=REDUCED_COLOUR, alpha=0.55, label=REDUCED_LABEL)
        fig.legend(handles=[grey], loc="outside lower center", fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def before_after(before: Sequence, after: Sequence, *, source: object = "own", title: str | None = None,
                 decimals: int = 2, chunk: int | None = None):
    """Two panels: each rank's tensor before and after a collective; `source` colours the 'after' cells."""
    return stages_figure({"before": before, "after": after}, sources={"after": source}, title=title,
                         decimals=decimals, chunk=chunk)


def chunk_owner(chunk: int) -> Callable[[int, int], int]:
    """A `source` for gathered output: element i came from rank i // chunk."""
    return lambda rank, index: index // chunk
