"""The screened ranking of a streamed gallery (``screen``; :mod:`benchmarks.ranking`, "Screened"): its first places
exactly as the full ranking ranks them, and the error bound its screen relies on."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks import ranking
from benchmarks.gallery_rows import TensorRows
from benchmarks.ranking import backfilling_scores, counting, pair_similarities, retrieval_scores
from benchmarks.ranking import screen as screening


def pairwise(queries: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
    """Every similarity by :func:`pair_similarities`, as the screened ranking takes those it keeps: the full ranking
    then rounds each similarity exactly as the screened one does."""
    rows, items = torch.meshgrid(torch.arange(len(queries)), torch.arange(len(gallery)), indexing="ij")
    return pair_similarities(queries, gallery, rows.flatten(), items.flatten()).view(len(queries), len(gallery))


def gallery_with_ties(n: int = 700, classes: int = 40, width: int = 48, seed: int = 0) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """Clusters wide enough that each query's first 100 places hold many classes, every tenth item a duplicate of
    the one before it (ties), and one run of 150 copies of a single item (ties at the screen's cut)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    features = rng.normal(size=(classes, width))[labels] + 3.5 * rng.normal(size=(n, width))
    features[10::10], labels[10::10] = features[9:-1:10], labels[9:-1:10]
    features[200:350], labels[200:350] = features[199], labels[199]
    return torch.tensor(features, dtype=torch.float32), torch.tensor(labels)


def assert_first_places_agree(screened: ranking.RetrievalScores, whole: ranking.RetrievalScores, depth: int) -> None:
    """Equal first ranks within ``depth`` (beyond it both lie beyond), equal AP@R, CMC to ``depth``, no mAP."""
    within = whole.first_rank <= depth
    assert np.array_equal(screened.first_rank[within], whole.first_rank[within])
    assert (screened.first_rank[~within] > depth).all()
    assert np.array_equal(screened.ap_at_r, whole.ap_at_r, equal_nan=True)
    assert screened.cmc_curve(depth) == whole.cmc_curve(depth)
    assert screened.mAP is None and screened.precision == screened.mAP_at_R == whole.mAP_at_R


@pytest.fixture
def recorded_widths(monkeypatch) -> list[int]:
    """The candidates per row of each screened block (the screen must leave most of the gallery out)."""
    widths: list[int] = []
    screen = screening.screen_candidates

    def recording(*args, **kwargs):
        candidates = screen(*args, **kwargs)
        widths.append(candidates.shape[1])
        return candidates
    monkeypatch.setattr(screening, "screen_candidates", recording)
    return widths


@pytest.mark.parametrize("room", [(8, 8192), (1, 4)])
def test_a_screened_sample_ranks_its_first_places_exactly_as_the_full_ranking(monkeypatch, recorded_widths, room):
    """A sample of queries against a gallery of 700 read in chunks of 64 rows, each query's own item left out: the
    same first ranks within 166 places (the largest class, with its 150 copies), the same AP@R, with duplicates and
    a run of ties at the cut; with a room of 170 candidates per row, the screen drops candidates as the cut rises
    and, where the ties still fill the room, screens the block again with more."""
    monkeypatch.setattr(counting, "similarities", pairwise)
    monkeypatch.setattr(screening, "SCREEN_ROOM", room[0])
    monkeypatch.setattr(screening, "SCREEN_SLACK", room[1])
    x, y = gallery_with_ties()
    sample = torch.arange(0, 700, 7)
    queries = x[sample] + 0.2 * torch.randn(len(sample), x.shape[1], generator=torch.Generator().manual_seed(1))
    whole, screened = (retrieval_scores(queries, y[sample], TensorRows(x, chunk_rows=64), y, exclude_self=True,
                                        query_index=sample, chunk_elements=6000, screen=screen)
                       for screen in (False, True))
    depth = screened.exact_depth
    assert depth == int(torch.bincount(y).max()) == 166
    assert_first_places_agree(screened, whole, depth)
    assert (whole.first_rank > depth).any() and max(recorded_widths) < 500


def test_every_step_of_screened_backfilling_curves_ranks_its_first_places_exactly(monkeypatch, recorded_widths):
    """Two curves of 6 steps over fresh and stale versions of each item: at every step the first 100 places of every
    query agree with the full ranking's (an item may be a candidate in one version and not in the other)."""
    monkeypatch.setattr(counting, "similarities", pairwise)
    x, y = gallery_with_ties(seed=2)
    stale = x + 0.9 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    fresh_from = torch.randint(0, 7, (2, len(x)), generator=torch.Generator().manual_seed(4))
    sample = torch.arange(3, 700, 9)
    whole, screened = (backfilling_scores(x[sample], y[sample], TensorRows(x, chunk_rows=100),
                                          TensorRows(stale, chunk_rows=100), y, fresh_from, 6, exclude_self=True,
                                          query_index=sample, chunk_elements=20000, screen=screen)
                       for screen in (False, True))
    for curve_whole, curve_screened in zip(whole, screened, strict=True):
        for step_whole, step_screened in zip(curve_whole, curve_screened, strict=True):
            assert_first_places_agree(step_screened, step_whole, step_screened.exact_depth)
    assert max(recorded_widths) < 500


def test_the_screen_reaches_as_deep_as_the_largest_class_for_map_at_r(monkeypatch):
    """With classes of up to 150 items, AP@R reads ranks up to 150: the screen ranks that deep."""
    monkeypatch.setattr(counting, "similarities", pairwise)
    x, y = gallery_with_ties(n=900, classes=6, seed=5)
    sample = torch.arange(0, 900, 11)
    whole, screened = (retrieval_scores(x[sample], y[sample], TensorRows(x, chunk_rows=128), y, exclude_self=True,
                                        query_index=sample, screen=screen) for screen in (False, True))
    depth = int(torch.bincount(y).max())
    assert screened.exact_depth == depth > ranking.CMC_DEPTH
    assert_first_places_agree(screened, whole, depth)


def test_the_bfloat16_product_stays_within_the_screens_error_bound():
    """Random rows, rows whose entries all round the same way (the errors add up), and near-parallel rows (the
    largest products, where the output's rounding is largest): the bfloat16 product a is within error +
    relative * |a| of the float32 similarity (here the largest error is about a twentieth of the bound, which
    assumes every rounding goes one way)."""
    assert screening.bfloat16_adds_in_float32()
    generator = torch.Generator().manual_seed(0)
    width = 1280
    random = F.normalize(torch.randn(300, width, generator=generator), dim=1)
    same_way = F.normalize(torch.full((2, width), 1.0 + 2.0 ** -9) * torch.tensor([[1.0], [1.0 + 2.0 ** -10]]), dim=1)
    parallel = F.normalize(random[:50] + 1e-3 * torch.randn(50, width, generator=generator), dim=1)
    rows = torch.cat([random, same_way, parallel])
    exact = pairwise(rows, rows)
    approx = (rows.bfloat16() @ rows.bfloat16().t()).float()
    error, relative = screening.screen_error(width)
    slack = error + relative * approx.abs() - (approx - exact).abs()
    assert slack.min() >= 0
    assert (approx - exact).abs().max() > (error + relative) / 100


def test_a_screened_ranking_refuses_what_it_cannot_rank_in_one_line():
    """A gallery in memory (the screen streams it), a CMC deeper than it ranks exactly, a device other than the
    CPU; its sampling interval is of mAP@R."""
    x, y = gallery_with_ties(n=300)
    with pytest.raises(ValueError, match="streams its gallery"):
        retrieval_scores(x, y, x, y, exclude_self=True, screen=True)
    screened = retrieval_scores(x, y, TensorRows(x), y, exclude_self=True, screen=True)
    depth = screened.exact_depth
    assert screened.cmc(depth) >= screened.cmc(5)
    with pytest.raises(ValueError, match=f"exact to rank {depth}, not {depth + 1}"):
        screened.cmc(depth + 1)
    assert set(screened.interval(0.95, 50)) == {"top1", "mAP@R"}
    with pytest.raises(ValueError, match="runs on CPU, not cuda"):
        screening.screen_depth(counting.LabelIndex(y), torch.device("cuda"))


def test_a_candidates_similarity_is_bit_for_bit_the_positives_one_in_any_chunk():
    """A screened ranking's candidates (:func:`benchmarks.ranking.cpu.candidate_dots`, read chunk by chunk from
    unaligned slices) and its positives (:func:`pair_similarities`) round each pair alike, so a candidate that
    duplicates a positive ties with it."""
    from benchmarks.ranking import cpu as ranking_cpu

    x, _ = gallery_with_ties(n=300, width=1280)
    unit = F.normalize(x, dim=1)
    queries = unit[:20].numpy()
    candidates = np.sort(np.random.default_rng(0).choice(300, size=(20, 40)), axis=1)
    found = np.full(candidates.shape, -np.inf, dtype=np.float32)
    cursor = np.zeros(20, dtype=np.int64)
    for start in range(0, 300, 37):
        ranking_cpu.candidate_dots(queries, unit[start:start + 37].numpy(), start, candidates, cursor, found)
    rows = torch.arange(20)[:, None].expand(-1, 40).flatten()
    expected = pair_similarities(unit[:20], unit, rows, torch.from_numpy(candidates).flatten()).view(20, 40)
    assert torch.equal(torch.from_numpy(found), expected) and (cursor == 40).all()
