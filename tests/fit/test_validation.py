"""``rankopt fit``'s validation as the index is searched (:mod:`rankopt.fit.validation`): the split, the scores
against a brute-force oracle, post-processing per protocol, and the serving rule for each ``--queries``. Vectors
are SYNTHETIC (clustered Gaussians)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.vectors import clustered
from rankopt.fit.post import (
    PostChoice,
    choose_for_protocols,
    choose_postprocessing,
    fit_whitenings,
    score_self_retrieval,
)
from rankopt.fit.validation import (
    BOTH,
    GALLERY_MAX,
    KNOWN,
    KNOWN_SHARE,
    NEW,
    OPEN_MIN_CLASSES,
    Pipeline,
    Scorer,
    Scores,
    admissible,
    choose_served,
    make_split,
    mix_gain,
    mixed_value,
    per_class_gain,
    score,
    score_all,
    search_mix,
)
from rankopt.postprocess import Expansion, PostProcessing
from rankopt.postprocess.expansion import alpha_query_expansion, database_augmentation


def names(n: int) -> list[str]:
    return [f"class{c}" for c in range(n)]


def test_the_split_keeps_queries_out_of_training_and_out_of_the_index():
    labels = np.repeat(np.arange(12), [10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 1, 3])
    split = make_split(labels, names(12), seed=0)
    parts = [split.train, split.known_queries, split.new_gallery, split.new_queries]
    assert sum(p.size for p in parts) == labels.size and np.unique(np.concatenate(parts)).size == labels.size
    assert split.protocols == (KNOWN, NEW)
    held = split.held_out_classes()
    assert held.size == 2 and not np.isin(split.labels[split.train], held).any()  # never trained on
    assert set(np.unique(labels[split.new_queries])) == set(held)
    for c in np.setdiff1d(np.unique(labels[split.train]), held):  # each kept class: a share kept back, one stays
        mine = np.flatnonzero(labels == c)
        assert np.isin(mine, split.train).any() and (mine.size < 2 or np.isin(mine, split.known_queries).any())
    assert not np.isin(np.concatenate([split.known_queries, split.new_queries]), split.gallery).any()
    assert np.isin(split.new_gallery, split.gallery).all() and np.isin(split.train, split.gallery).all()
    assert np.array_equal(split.rows, np.arange(labels.size))
    again = make_split(labels, names(12), seed=0)
    assert np.array_equal(again.known_queries, split.known_queries)  # drawn with the seed
    assert not np.array_equal(make_split(labels, names(12), seed=1).known_queries, split.known_queries)


def test_a_folder_with_few_classes_validates_on_known_queries_alone_and_one_class_is_refused():
    labels = np.repeat(np.arange(OPEN_MIN_CLASSES - 1), 5)
    split = make_split(labels, names(OPEN_MIN_CLASSES - 1), seed=0)
    assert split.protocols == (KNOWN,) and split.new_queries.size == 0 and "too few" in split.open_note
    assert "too few to hold whole classes out" in split.summary()
    with pytest.raises(ValueError, match="at least 2 classes"):
        make_split(np.zeros(5, dtype=int), ["only"], seed=0)


def test_large_folders_cap_the_validation_index_and_queries_by_class(monkeypatch):
    from rankopt.fit import validation

    monkeypatch.setattr(validation, "GALLERY_MAX", 100)
    monkeypatch.setattr(validation, "KNOWN_QUERIES_MAX", 30)
    labels = np.repeat(np.arange(20), 50)
    split = make_split(labels, names(20), seed=0)
    assert split.gallery.size <= 100 + 20 and split.known_queries.size <= 30 + 16
    assert set(np.unique(labels[split.gallery])) == set(range(20))  # every class sampled, known and held out
    indexed = np.bincount(labels[split.gallery], minlength=20)
    available = np.bincount(labels[np.union1d(split.train, split.new_gallery)], minlength=20)
    share = indexed / available  # one share for every class, as the served index holds them (rounded per class)
    assert share.max() - share.min() <= 1.5 / available.min()


def test_held_out_classes_do_not_crowd_the_known_ones_out_of_a_capped_index():
    """A large folder's held-out half (more photos than the cap) shares the validation index with the known classes
    in proportion: before, it was kept whole and left each known class one indexed photo, so a known query had one
    relevant photo (mAP@R = recall@1) and a DBA pulled that photo towards other classes (49,452 photos: 0.03)."""
    labels = np.repeat(np.arange(100), 500)
    split = make_split(labels, names(100), seed=0)
    assert split.new_gallery.size > GALLERY_MAX  # the case: the held-out half alone exceeds the cap
    assert split.gallery.size <= GALLERY_MAX + 100
    known = np.setdiff1d(np.arange(100), split.held_out_classes())
    per_known_class = np.bincount(labels[split.gallery], minlength=100)[known]
    assert per_known_class.min() >= 20  # 400 training photos each, a share of 3,000 / 37,500 of them: 32


def brute_map_at_r(q: torch.Tensor, q_y: np.ndarray, g: torch.Tensor, g_y: np.ndarray) -> float:
    """mAP@R from its definition (ROADMAP eq. 8), float64: for each query, R = its relevant items in the gallery,
    the precision at each relevant item among the first R, summed over them, divided by R."""
    sims = (torch.nn.functional.normalize(q.double(), dim=1) @ torch.nn.functional.normalize(g.double(), dim=1).T)
    values = []
    for i in range(len(q)):
        relevant = g_y == q_y[i]
        r = int(relevant.sum())
        if r == 0:
            continue
        order = np.argsort(-sims[i].numpy(), kind="stable")[:r]
        hits = relevant[order]
        values.append(sum(hits[: k + 1].sum() / (k + 1) for k in range(r) if hits[k]) / r)
    return float(np.mean(values))


def test_a_protocol_is_scored_as_the_index_answers_it():
    x, labels = clustered(12, 8, 16, 0.8, 0)
    split = make_split(labels, names(12), seed=3)
    for protocol in split.protocols:
        q_rows, g_rows = split.queries(protocol), split.gallery
        plain = score(x, split, protocol)
        assert plain.value == pytest.approx(brute_map_at_r(x[q_rows], labels[q_rows], x[g_rows], labels[g_rows]))
        assert set(plain.by_class) == {f"class{c}" for c in np.unique(labels[q_rows])}
        steps = PostProcessing(None, None, Expansion(3, 1.0), Expansion(2, 2.0))
        # DBA over the index alone (no query among its neighbours), then αQE of each query against it
        augmented = database_augmentation(x[g_rows], Expansion(3, 1.0))
        expanded = alpha_query_expansion(x[q_rows], augmented, Expansion(2, 2.0))
        by_hand = brute_map_at_r(expanded, labels[q_rows], augmented, labels[g_rows])
        assert score(x, split, protocol, steps).value == pytest.approx(by_hand, abs=1e-6)


def test_the_scorer_whitens_once_and_scores_as_score_all(monkeypatch):
    x, labels = clustered(12, 8, 16, 0.8, 2)
    split = make_split(labels, names(12), seed=1)
    train = np.intersect1d(split.train, split.gallery)
    tried: list = []
    whitenings = [w for _, w in fit_whitenings(x[split.positions(train)], split.labels[train], tried)]
    assert len(whitenings) == 6 and not tried  # PCA and supervised at three shrinkages each
    applied = []
    original = type(whitenings[0]).apply
    monkeypatch.setattr(type(whitenings[0]), "apply",
                        lambda self, *a, **k: applied.append(self) or original(self, *a, **k))
    scorer = Scorer(x, split)
    for whitening in whitenings:
        for dba, qe in ((None, None), (Expansion(3, 1.0), None), (Expansion(2, 1.0), Expansion(2, 2.0))):
            steps = PostProcessing(None, whitening, dba, qe)
            cached, direct = scorer.all(steps), score_all(x, split, steps)
            for protocol in split.protocols:
                assert cached[protocol].metrics == pytest.approx(direct[protocol].metrics, abs=1e-6)
                assert cached[protocol].by_class.keys() == direct[protocol].by_class.keys()
                for name, metrics in direct[protocol].by_class.items():
                    assert cached[protocol].by_class[name] == pytest.approx(metrics, abs=1e-6)
    # each whitening applied once by the scorer (then once per direct call): 6 + 6 x 3
    assert len(applied) == len(whitenings) * 4
    assert scorer.one(KNOWN).value == pytest.approx(score(x, split, KNOWN).value)


def test_post_processing_is_chosen_per_protocol_with_the_scores_of_its_own_steps():
    x, labels = clustered(12, 10, 16, 0.9, 1)
    split = make_split(labels, names(12), seed=0)
    choices = choose_for_protocols(x, split)
    assert set(choices) == {KNOWN, NEW, BOTH}
    for protocol in (KNOWN, NEW):
        choice = choices[protocol]
        assert choice.metrics["map@r"] == pytest.approx(score(x, split, protocol, choice.steps(choice.fitted_whitening)).value)
        assert choice.metrics["map@r"] >= score(x, split, protocol).value  # a step is kept only when it helps
        assert choice.tried[0][0] == "none"
    # both: the best on the mix of searches among the steps not below the plain features on new classes beyond noise
    floor = score(x, split, NEW)
    mix = search_mix(BOTH, split.protocols)
    both = score_all(x, split, choices[BOTH].steps(choices[BOTH].fitted_whitening))
    assert admissible(floor, both[NEW])[0] and choices[BOTH].metrics["map@r"] == pytest.approx(both[KNOWN].value)
    # whole pipelines are compared: no admissible candidate among the protocols' own choices (or no steps) is better
    for other in (PostChoice(None, None, None, {}, []), choices[KNOWN], choices[NEW]):
        scores = score_all(x, split, other.steps(other.fitted_whitening))
        if admissible(floor, scores[NEW])[0]:
            assert mixed_value(both, mix) >= mixed_value(scores, mix) - 1e-12
    strict = choose_for_protocols(x, split, floor=Scores(floor.metrics, {c: {"map@r": 2.0} for c in floor.by_class}))
    assert strict[BOTH].describe() == "none" and all(v == float("-inf") for _, v in strict[BOTH].tried)


def test_the_papers_self_retrieval_choice_is_kept_for_the_benchmarks():
    x, labels = clustered(10, 8, 16, 0.6, 1)
    train, val = np.arange(40), np.arange(40, 80)
    choice = choose_postprocessing(x[train], labels[train], x[val], labels[val])
    none = score_self_retrieval(x[val], labels[val])["map@r"]
    assert choice.metrics["map@r"] >= none and set(choice.metrics) >= {"map@r", "recall@1"}
    without = choose_postprocessing(x[train], labels[train], x[val], labels[val], dba=False)
    assert without.dba is None and not any(what.startswith("DBA") for what, _ in without.tried)
    only = choose_postprocessing(x[train], labels[train], x[val], labels[val], ks=(2, 4))
    expansions = [what for what, _ in only.tried if what.startswith(("DBA", "αQE"))]
    assert len(expansions) == 2 * 2 * 3 and all(" k=2 " in w or " k=4 " in w for w in expansions)


def test_a_gain_is_clear_only_beyond_the_luck_of_the_classes():
    base = {f"c{i}": {"map@r": 0.5} for i in range(8)}
    steady = {c: {"map@r": 0.52 + 0.001 * i} for i, c in enumerate(base)}  # +0.0235, tiny spread
    noisy = {c: {"map@r": 0.5 + (0.2 if i % 2 else -0.19)} for i, c in enumerate(base)}  # +0.005, se 0.07
    mean, se, clear = per_class_gain(base, steady)
    gains = np.array([steady[c]["map@r"] - 0.5 for c in base])
    assert mean == pytest.approx(gains.mean()) and se == pytest.approx(gains.std(ddof=1) / np.sqrt(8)) and clear
    assert not per_class_gain(base, noisy)[2]
    assert not per_class_gain({"a": {"map@r": 0.5}}, {"a": {"map@r": 0.9}})[2]  # one class: no spread


def test_the_gain_on_a_mix_of_searches_weighs_each_protocol_and_adds_their_errors():
    base = {KNOWN: Scores({}, {f"k{i}": {"map@r": 0.5} for i in range(6)}),
            NEW: Scores({}, {f"n{i}": {"map@r": 0.6} for i in range(4)})}
    other = {KNOWN: Scores({}, {f"k{i}": {"map@r": 0.6 + 0.01 * i} for i in range(6)}),
             NEW: Scores({}, {f"n{i}": {"map@r": 0.55 - 0.02 * i} for i in range(4)})}
    mix = search_mix(BOTH, (KNOWN, NEW))
    assert mix == {KNOWN: KNOWN_SHARE, NEW: 1 - KNOWN_SHARE}
    (mk, sk, _), (mn, sn, _) = (per_class_gain(base[p].by_class, other[p].by_class) for p in (KNOWN, NEW))
    mean, se, clear = mix_gain(base, other, mix)
    assert mean == pytest.approx(KNOWN_SHARE * mk + (1 - KNOWN_SHARE) * mn)
    assert se == pytest.approx(np.hypot(KNOWN_SHARE * sk, (1 - KNOWN_SHARE) * sn)) and clear == (mean > se)
    assert mix_gain(base, other, search_mix(KNOWN, (KNOWN, NEW))) == per_class_gain(base[KNOWN].by_class,
                                                                                    other[KNOWN].by_class)
    assert search_mix(NEW, (KNOWN,)) == search_mix(BOTH, (KNOWN,)) == {KNOWN: 1.0}  # no open-set validation


def pipeline(model: str, steps_for: str | None, known: float, new: float, spread: float = 0.001) -> Pipeline:
    """SYNTHETIC scores: 8 classes per protocol around ``known`` / ``new``."""
    def scores(level: float) -> Scores:
        return Scores({"map@r": level}, {f"c{i}": {"map@r": level + spread * (i - 3.5)} for i in range(8)})

    return Pipeline(model, steps_for, {KNOWN: scores(known), NEW: scores(new)})


def test_the_served_pipeline_follows_the_searches_the_person_states():
    features = pipeline("features", None, 0.50, 0.60)
    features_post = pipeline("features", KNOWN, 0.55, 0.70)
    tuned = pipeline("fine-tuned", None, 0.90, 0.71)
    tuned_post = pipeline("fine-tuned", KNOWN, 0.95, 0.50)  # best on known, clearly worse on new classes
    every = [features, features_post, tuned, tuned_post]
    served, why = choose_served(every, KNOWN, (KNOWN, NEW))
    assert served is tuned_post and "fine-tuned pipeline is served" in why[-1]
    served, why = choose_served(every, "both", (KNOWN, NEW))
    assert served is tuned  # the best on the mix among those not below the plain features on new classes
    assert any(line.startswith("fine-tuned + post-processing for known queries left out") for line in why)
    served, _ = choose_served(every, NEW, (KNOWN, NEW))
    assert served is tuned  # the only one above the features' best on new classes
    served, _ = choose_served([features, features_post, tuned_post], NEW, (KNOWN, NEW))
    assert served is features_post  # no fine-tuned pipeline beats the features on new classes
    served, why = choose_served(every, NEW, (KNOWN,))  # no open-set validation: chosen on known, and said
    assert served is tuned_post and "too few classes" in why[0]
    # both weighs the searches: +0.07 on known photos outweighs -0.09 on new classes that stay above the features
    trade = pipeline("fine-tuned", BOTH, 0.97, 0.62)
    served, why = choose_served([*every, trade], BOTH, (KNOWN, NEW))
    assert served is trade and "at 75%" in why[-1] and "fine-tuned pipeline is served" in why[-1]
    assert choose_served([*every, trade], NEW, (KNOWN, NEW))[0] is tuned  # new alone: no such trade
    costly = pipeline("fine-tuned", BOTH, 0.99, 0.58)  # best on the mix, but below the plain features on new
    served, why = choose_served([*every, costly], BOTH, (KNOWN, NEW))
    assert served is tuned and any(w.startswith("fine-tuned + post-processing for both queries left out") for w in why)
    noisy = pipeline("fine-tuned", None, 0.555, 0.70, spread=0.2)  # +0.005 with a spread of 0.2: luck
    served, why = choose_served([features, features_post, noisy], KNOWN, (KNOWN, NEW))
    assert served is features_post and "untrained pipeline is served" in why[-1]
