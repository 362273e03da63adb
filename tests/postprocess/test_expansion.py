"""αQE and DBA (rankopt.postprocess.expansion, PostProcessing, engine.embed_and_score.score): against a
float64 brute force written from the formula, the identity at k = 0, exclusion of a query's own
item, and mAP gains on SYNTHETIC tight clusters with noisy queries."""

from __future__ import annotations

import pytest
import torch

from rankopt.config import EvalConfig
from rankopt.engine.embed_and_score import EmbeddedSplit, score
from rankopt.postprocess import (
    Expansion,
    PostProcessing,
    alpha_query_expansion,
    database_augmentation,
)

from .helpers import clustered, mean_ap


def brute_force(vectors: torch.Tensor, candidates: torch.Tensor, k: int, alpha: float,
                excluded: list[int | None]) -> torch.Tensor:
    """``normalize(v + Σ_{i≤k} max(s_i, 0)^α c_i)`` in float64 with a Python loop over rows."""
    v = torch.nn.functional.normalize(vectors.double(), dim=1)
    c = torch.nn.functional.normalize(candidates.double(), dim=1)
    out = []
    for row, own in zip(v, excluded):
        sims = [(float(row @ c[j]), j) for j in range(len(c)) if j != own]
        top = sorted(sims, key=lambda t: -t[0])[:k]
        total = row.clone()
        for s, j in top:
            total += max(s, 0.0) ** alpha * c[j]
        out.append(total / total.norm())
    return torch.stack(out)


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(17, 5, generator=gen), torch.randn(23, 5, generator=gen)


@pytest.mark.parametrize(("k", "alpha"), [(1, 2.0), (4, 3.0), (6, 0.0)])
def test_query_expansion_matches_brute_force(k, alpha):
    queries, gallery = _data()
    got = alpha_query_expansion(queries, gallery, Expansion(k, alpha), chunk_size=5)
    assert torch.allclose(got.double(), brute_force(queries, gallery, k, alpha, [None] * 17), atol=1e-5)
    own = torch.tensor([i % 23 if i % 3 else -1 for i in range(17)])  # copies in the gallery, excluded
    got = alpha_query_expansion(queries, gallery, Expansion(k, alpha), exclude=own)
    expected = brute_force(queries, gallery, k, alpha, [int(j) if j >= 0 else None for j in own])
    assert torch.allclose(got.double(), expected, atol=1e-5)


@pytest.mark.parametrize(("k", "alpha"), [(1, 1.0), (5, 2.0)])
def test_dba_matches_brute_force_without_the_item_itself(k, alpha):
    _, gallery = _data(1)
    got = database_augmentation(gallery, Expansion(k, alpha), chunk_size=4)
    assert torch.allclose(got.double(), brute_force(gallery, gallery, k, alpha, list(range(23))), atol=1e-5)


def test_k_zero_is_the_identity():
    queries, gallery = _data()
    assert alpha_query_expansion(queries, gallery, Expansion(0)) is queries
    assert database_augmentation(gallery, Expansion(0)) is gallery


def test_self_retrieval_postprocessing_excludes_each_query():
    """One split as queries and gallery: DBA over the others, αQE against the augmented gallery
    without the query's own (augmented) item."""
    x, _ = _data()
    post = PostProcessing(dba=Expansion(3, 2.0), qe=Expansion(4, 2.0))
    query, gallery = post.expand(x, None)
    augmented = brute_force(x, x, 3, 2.0, list(range(17)))
    assert torch.allclose(gallery.double(), augmented, atol=1e-5)
    expected = brute_force(torch.nn.functional.normalize(x.double(), dim=1), augmented, 4, 2.0, list(range(17)))
    assert torch.allclose(query.double(), expected, atol=1e-5)


def test_bad_inputs_are_named():
    queries, gallery = _data()
    with pytest.raises(ValueError, match="have 5 dimensions, the gallery 4"):
        alpha_query_expansion(queries, gallery[:, :4], Expansion(2))
    bad = gallery.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="gallery"):
        alpha_query_expansion(queries, bad, Expansion(2))
    with pytest.raises(ValueError, match="similarity"):
        alpha_query_expansion(queries, gallery, Expansion(2), similarity="neg_l2")
    with pytest.raises(ValueError, match="k must be >= 0"):
        Expansion(-1)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        Expansion(2, float("nan"))


# --- helps where it must (SYNTHETIC) --------------------------------------------------------------

def _tight_gallery_noisy_queries():
    """SYNTHETIC: 30 classes in 32-d, a gallery clustered around unit centres (std 0.15) and noisier
    queries (std 0.3)."""
    gallery, gallery_labels, centres = clustered(30, 10, 32, spread=0.15, seed=0)
    queries, labels, _ = clustered(30, 4, 32, spread=0.3, seed=1, centres=centres)
    return queries, labels, gallery, gallery_labels


def test_query_expansion_raises_map_on_tight_clusters():
    queries, labels, gallery, gallery_labels = _tight_gallery_noisy_queries()
    before = mean_ap(queries, labels, gallery, gallery_labels)
    expanded, _ = PostProcessing(qe=Expansion(5, 2.0)).expand(queries, gallery)
    after = mean_ap(expanded, labels, gallery, gallery_labels)
    assert after > before + 0.1, (before, after)


def test_dba_raises_map_of_noisy_queries():
    queries, labels, gallery, gallery_labels = _tight_gallery_noisy_queries()
    before = mean_ap(queries, labels, gallery, gallery_labels)
    same, augmented = PostProcessing(dba=Expansion(5, 2.0)).expand(queries, gallery)
    assert same is queries
    after = mean_ap(queries, labels, augmented, gallery_labels)
    assert after > before + 0.1, (before, after)


def test_dba_and_qe_raise_map_in_self_retrieval():
    """SYNTHETIC: 30 classes of 10 items (std 0.2 around unit centres); scored by engine.embed_and_score.score."""
    x, labels, _ = clustered(30, 10, 32, spread=0.2, seed=2)
    split = [EmbeddedSplit(x, labels.unsqueeze(1), [f"i{j}" for j in range(len(x))])]
    cfg = EvalConfig(metrics=["map"])
    before = score(split, cfg).metrics["map"]
    dba = score(split, cfg, postprocessing=PostProcessing(dba=Expansion(5, 2.0))).metrics["map"]
    both = score(split, cfg, postprocessing=PostProcessing(dba=Expansion(5, 2.0), qe=Expansion(5, 2.0))).metrics["map"]
    assert dba > before + 0.08 and both > before + 0.15, (before, dba, both)
    assert before == pytest.approx(mean_ap(x, labels.unsqueeze(1)))


def test_landmark_protocol_scores_the_postprocessed_embeddings():
    """SYNTHETIC revisitop-style ground truth: score() ranks with the DBA/αQE embeddings."""
    from rankopt.metrics.landmarks import revisited_map
    from rankopt.similarity import pairwise

    queries, labels, gallery, gallery_labels = _tight_gallery_noisy_queries()
    gnd = [{"easy": torch.nonzero(gallery_labels == label).squeeze(1).tolist(), "hard": [], "junk": []}
           for label in labels.tolist()]
    query_split = EmbeddedSplit(queries, labels.unsqueeze(1), [f"q{i}" for i in range(len(queries))],
                                {"ground_truth": gnd})
    gallery_split = EmbeddedSplit(gallery, gallery_labels.unsqueeze(1), [f"g{i}" for i in range(len(gallery))])
    post = PostProcessing(dba=Expansion(3, 2.0), qe=Expansion(5, 2.0))
    got = score([query_split, gallery_split], EvalConfig(), postprocessing=post).metrics
    expanded, augmented = post.expand(queries, gallery)
    expected = revisited_map(pairwise(expanded, augmented), gnd)
    assert got["easy/map"] == pytest.approx(expected["easy/map"])
    plain = score([query_split, gallery_split], EvalConfig()).metrics
    assert got["easy/map"] > plain["easy/map"] + 0.1
