"""helpers.plot_collectives: the cells, values and colours drawn for each rank."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from helpers.plot import palette  # noqa: E402
from helpers.plot_collectives import (  # noqa: E402
    REDUCED_COLOUR,
    REDUCED_LABEL,
    before_after,
    chunk_owner,
    format_value,
    stages_figure,
)

RANKS = [torch.tensor([1.0, 2.0]) + 10 * r for r in range(3)]  # rank r holds [10r+1, 10r+2]
COLOURS = {r: to_hex(c) for r, c in palette(range(3)).items()}


def cells(ax):
    """{(rank row, element column): (text shown, hex colour)} for one panel."""
    texts = {(int(t.get_position()[1]), int(t.get_position()[0])): t.get_text() for t in ax.texts}
    return {(int(p.get_y()), int(p.get_x())): (texts[(int(p.get_y()), int(p.get_x()))], to_hex(p.get_facecolor()))
            for p in ax.patches if isinstance(p, Rectangle)}


def test_before_after_draws_one_cell_per_element_with_its_value():
    fig = before_after(RANKS, [t * 2 for t in RANKS])
    assert isinstance(fig, Figure) and [ax.get_title() for ax in fig.axes] == ["before", "after"]
    before, after = (cells(ax) for ax in fig.axes)
    assert len(before) == len(after) == 6
    assert before[(1, 0)][0] == "11" and after[(2, 1)][0] == "44"
    assert before[(2, 1)][1] == COLOURS[2] and after[(0, 0)][1] == COLOURS[0]  # 'own': each row its rank's
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]


def test_broadcast_source_paints_every_row_in_the_root_colour():
    after = cells(before_after(RANKS, [RANKS[1]] * 3, source=1).axes[1])
    assert {colour for _, colour in after.values()} == {COLOURS[1]}
    assert {text for text, _ in after.values()} == {"11", "12"}


def test_gathered_cells_take_the_colour_of_the_rank_they_came_from():
    gathered = torch.cat(RANKS)
    after = cells(before_after(RANKS, [gathered] * 3, source=chunk_owner(2)).axes[1])
    assert len(after) == 18
    assert [after[(2, i)] for i in range(6)] == [(format_value(v, 2), COLOURS[i // 2])
                                                  for i, v in enumerate(gathered.tolist())]


def test_reduced_values_are_grey_and_explained_in_a_legend():
    mean = sum(RANKS) / 3
    fig = before_after(RANKS, [mean] * 3, source="reduced")
    after = cells(fig.axes[1])
    assert {colour for _, colour in after.values()} == {to_hex(REDUCED_COLOUR)}
    assert after[(0, 0)][0] == "11" and after[(1, 1)][0] == "12"
    assert [t.get_text() for legend in fig.legends for t in legend.get_texts()] == [REDUCED_LABEL]
    assert not before_after(RANKS, RANKS).legends  # no grey cell, no legend


def test_three_stages_and_uneven_lengths():
    fig = stages_figure({"in": RANKS, "mid": [t[:1] for t in RANKS], "out": [torch.cat(RANKS)] * 3},
                        sources={"mid": "reduced"}, title="reduce_scatter, then all_gather")
    assert [len(cells(ax)) for ax in fig.axes] == [6, 3, 18]
    assert fig.get_suptitle() == "reduce_scatter, then all_gather"


@pytest.mark.parametrize("value, text", [(7.0, "7"), (5.5, "5.5"), (3.25, "3.25"), (1 / 3, "0.33"), (-0.001, "0")])
def test_format_value(value, text):
    assert format_value(value, 2) == text


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match="one entry per rank"):
        stages_figure({"before": RANKS, "after": RANKS[:2]})
    with pytest.raises(ValueError, match="source="):
        before_after(RANKS, RANKS, source="everyone")


def test_chunk_draws_a_line_between_pieces():
    fig = stages_figure({"in": [torch.arange(6.0)] * 3, "out": [torch.arange(2.0)] * 3}, chunk=2)
    assert [sorted(line.get_xdata()[0] for line in ax.lines) for ax in fig.axes] == [[2, 4], []]
    assert not before_after(RANKS, RANKS).axes[0].lines  # no chunk, no lines
