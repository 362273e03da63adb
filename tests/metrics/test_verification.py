"""1:1 verification (rankopt.metrics.verification) against scikit-learn's ROC, brute-force loops over
thresholds, hand-made TAR@FAR cases and loop transcriptions of the IJB-C template features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from rankopt.metrics import verification
from rankopt.metrics.verification import (
    far_key,
    group_mean,
    roc_points,
    tar_at_far,
    template_embeddings,
    verification_metrics,
)


def brute_roc(scores, labels):
    """FAR and TAR at +inf then at each distinct score, by counting."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels)
    thresholds = [math.inf, *sorted(set(scores.tolist()), reverse=True)]
    far = [np.mean(scores[labels == 0] >= t) for t in thresholds]
    tar = [np.mean(scores[labels == 1] >= t) for t in thresholds]
    return np.array(far), np.array(tar), np.array(thresholds)


def brute_tar_at_far(scores, labels, target):
    """The best TAR over all thresholds with FAR <= target; NaN below one impostor's FAR."""
    if np.sum(np.asarray(labels) == 0) * target < 1 - 1e-9:
        return math.nan
    far, tar, _ = brute_roc(scores, labels)
    return max(t for f, t in zip(far, tar) if f <= target)


def random_pairs(seed, n=300, levels=25):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    scores = np.round(rng.normal(labels * 1.0, 1.0) * levels) / levels  # rounded: many ties
    return scores, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_points_match_sklearn_and_brute_force(seed):
    scores, labels = random_pairs(seed)
    far, tar, thresholds = roc_points(scores, labels)
    fpr, tpr, thr = roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(far, fpr, rtol=0, atol=1e-15)
    np.testing.assert_allclose(tar, tpr, rtol=0, atol=1e-15)
    assert thresholds[0] == math.inf
    np.testing.assert_array_equal(thresholds[1:], thr[1:])
    b_far, b_tar, b_thr = brute_roc(scores, labels)
    np.testing.assert_allclose(far, b_far, rtol=0, atol=1e-15)
    np.testing.assert_allclose(tar, b_tar, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(thresholds, b_thr)
    assert far.dtype == tar.dtype == thresholds.dtype == np.float64


def test_roc_points_group_ties():
    far, tar, thresholds = roc_points([0.9, 0.8, 0.8, 0.3], [1, 1, 0, 0])
    np.testing.assert_array_equal(thresholds, [math.inf, 0.9, 0.8, 0.3])
    np.testing.assert_array_equal(tar, [0.0, 0.5, 1.0, 1.0])
    np.testing.assert_array_equal(far, [0.0, 0.0, 0.5, 1.0])  # the tied genuine and impostor enter together


def test_tar_at_far_takes_the_lowest_threshold_within_the_target():
    impostors = np.arange(1.0, 11.0)  # 10 impostors: FARs are multiples of 0.1
    genuine = np.array([10.5, 9.5, 8.5, 3.0])
    scores = np.concatenate([impostors, genuine])
    labels = np.array([0] * 10 + [1] * 4)
    out = tar_at_far(scores, labels, fars=(0.05, 0.1, 0.2, 1.0))
    assert list(out) == ["tar@far=5e-02", "tar@far=1e-01", "tar@far=2e-01", "tar@far=1e+00"]
    assert math.isnan(out["tar@far=5e-02"])  # 10 impostors < 1 / 0.05: not measurable
    assert out["tar@far=1e-01"] == 0.5  # threshold 9.5 accepts impostor 10 and genuine 10.5, 9.5
    assert out["tar@far=2e-01"] == 0.75  # threshold 8.5
    assert out["tar@far=1e+00"] == 1.0


def test_tar_at_far_with_a_target_no_score_reaches():
    # two impostors tie with the top genuine pair: any threshold <= 5 accepts both (FAR 0.2)
    scores = np.array([5.0, 5.0] + [1.0] * 8 + [5.0, 4.0, 2.0])
    labels = np.array([0] * 10 + [1] * 3)
    out = tar_at_far(scores, labels, fars=(0.1, 0.2, 0.5))
    assert out["tar@far=1e-01"] == 0.0  # only the threshold +inf: nothing accepted
    assert out["tar@far=2e-01"] == 1.0  # threshold 2
    assert out["tar@far=5e-01"] == 1.0  # threshold 1 would give FAR 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tar_at_far_matches_brute_force(seed):
    scores, labels = random_pairs(seed, n=400, levels=8)
    fars = (1e-3, 1e-2, 3e-2, 1e-1, 0.25)
    out = tar_at_far(scores, labels, fars=fars)
    for target in fars:
        np.testing.assert_equal(out[far_key(target)], brute_tar_at_far(scores, labels, target))


def test_far_key_is_exact():
    assert far_key(1e-6) == "tar@far=1e-06"
    assert far_key(1e-4) == "tar@far=1e-04"
    assert far_key(0.015) == "tar@far=1.5e-02"


@pytest.mark.parametrize(("scores", "labels", "fars", "match"), [
    ([0.1, math.nan, 0.3], [0, 1, 1], (0.1,), "NaN or Inf.*pair 1"),
    ([0.1, math.inf, 0.3], [0, 1, 1], (0.1,), "NaN or Inf.*pair 1"),
    ([0.1, 0.2, 0.3], [0, 2, 1], (0.1,), "pair 1 has label 2"),
    ([0.1, 0.2], [1, 1], (0.1,), "no impostor"),
    ([0.1, 0.2], [0, 0], (0.1,), "no genuine"),
    ([0.1, 0.2], [0, 1, 1], (0.1,), "shapes"),
    ([0.1, 0.2], [0, 1], (0.0,), r"\(0, 1\]"),
    ([0.1, 0.2], [0, 1], (1.5,), r"\(0, 1\]"),
])  # fmt: skip
def test_tar_at_far_rejects_bad_input(scores, labels, fars, match):
    with pytest.raises(ValueError, match=match):
        tar_at_far(scores, labels, fars=fars)


@pytest.mark.parametrize("row_chunk", [3, 65536])
def test_group_mean_matches_a_numpy_loop(monkeypatch, row_chunk):
    monkeypatch.setattr(verification, "ROW_CHUNK", row_chunk)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 4)).astype(np.float32)
    groups = rng.choice([-3, 7, 40, 2, 11], size=23)
    means, ids = group_mean(torch.from_numpy(x), groups)
    expected_ids = sorted(set(groups.tolist()))
    assert ids.tolist() == expected_ids and ids.dtype == torch.int64
    assert means.dtype == torch.float32
    for g, gid in enumerate(expected_ids):
        np.testing.assert_allclose(means[g].numpy(), x[groups == gid].astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-7)


def test_group_mean_rejects_bad_groups():
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        group_mean(x, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integer"):
        group_mean(x, np.array([0.0, 1.0, 2.0, 3.0]))


def normalize(v):
    return v / np.linalg.norm(v)


def test_template_embeddings_weigh_media_alike():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 3))
    media = np.array([10, 10, 10, 11, 12])  # items 0-2: frames of one video; 3, 4: stills
    templates = np.array([[5, 0], [5, 1], [5, 2], [5, 3],  # a video of 3 frames and a still
                          [7, 3], [7, 4],  # item 3 is in templates 5 and 7
                          [9, 1], [9, 2]])  # two of the video's frames only
    feats, ids = template_embeddings(torch.from_numpy(x), media, templates)
    assert ids.tolist() == [5, 7, 9]
    assert feats.dtype == torch.float64
    expected = [normalize(x[:3].mean(axis=0) + x[3]), normalize(x[3] + x[4]), normalize(x[1:3].mean(axis=0))]
    np.testing.assert_allclose(feats.numpy(), np.stack(expected), rtol=1e-12, atol=1e-12)
    item_weighted = normalize(x[:4].sum(axis=0))
    assert not np.allclose(feats[0].numpy(), item_weighted, atol=1e-3)


def loop_template_features(x, media, templates):
    """Transcription of the protocol: per template, per media, mean of the rows; sum; normalise."""
    out = {}
    for t in sorted(set(templates[:, 0].tolist())):
        items = templates[templates[:, 0] == t, 1]
        total = np.zeros(x.shape[1])
        for m in set(media[items].tolist()):
            total += x[items[media[items] == m]].mean(axis=0)
        out[t] = normalize(total)
    return out


def synthetic_protocol(seed):
    rng = np.random.default_rng(seed)
    num_items = 40
    x = rng.normal(size=(num_items, 6)).astype(np.float32)
    media = rng.integers(100, 125, num_items)  # about 25 media, some with several frames
    rows = [(t, i) for t in range(12) for i in rng.choice(num_items, size=rng.integers(1, 6), replace=False)]
    templates = np.array(rows)
    pairs = np.array([(a, b, int(rng.random() < 0.3)) for a in range(12) for b in range(a + 1, 12)])
    pairs[:2, 2] = (1, 0)  # both kinds present
    return x, media, templates, pairs


@pytest.mark.parametrize("similarity", ["cosine", "dot", "neg_l2"])
@pytest.mark.parametrize("chunks", [(5, 7), (65536, 1 << 20)])
def test_verification_metrics_match_a_loop_transcription(monkeypatch, similarity, chunks):
    monkeypatch.setattr(verification, "ROW_CHUNK", chunks[0])
    monkeypatch.setattr(verification, "PAIR_CHUNK", chunks[1])
    x, media, templates, pairs = synthetic_protocol(0)
    fars = (0.01, 0.05, 0.1, 0.3)
    out = verification_metrics(torch.from_numpy(x), media, templates, pairs, similarity=similarity, fars=fars)
    feats = loop_template_features(x.astype(np.float64), media, templates)
    scores = [float(feats[a] @ feats[b]) for a, b, _ in pairs]
    assert list(out) == [far_key(f) for f in fars]
    for target in fars:
        np.testing.assert_equal(out[far_key(target)], brute_tar_at_far(scores, pairs[:, 2], target))
    assert math.isnan(out[far_key(0.01)])  # 66 pairs: fewer than 100 impostors
    assert not math.isnan(out[far_key(0.3)])


def test_verification_metrics_name_bad_rows():
    x, media, templates, pairs = synthetic_protocol(0)
    emb = torch.from_numpy(x)
    bad_pairs = pairs.copy()
    bad_pairs[3, 1] = 99
    with pytest.raises(ValueError, match="template_pairs row 3: template 99"):
        verification_metrics(emb, media, templates, bad_pairs)
    bad_templates = templates.copy()
    bad_templates[2, 1] = 40
    with pytest.raises(ValueError, match=r"templates row 2: item index 40 is outside \[0, 40\)"):
        verification_metrics(emb, media, bad_templates, pairs)
    with pytest.raises(ValueError, match=r"media must have shape \(40,\)"):
        verification_metrics(emb, media[:-1], templates, pairs)
    with pytest.raises(ValueError, match=r"template_pairs must have shape \(rows, 3\)"):
        verification_metrics(emb, media, templates, pairs[:, :2])
    with pytest.raises(ValueError, match="unknown similarity"):
        verification_metrics(emb, media, templates, pairs, similarity="l1")


@pytest.mark.parametrize("pair_chunk", [7, 1 << 20])
def test_all_pairs_tar_at_far_scores_every_pair_once(monkeypatch, pair_chunk):
    """Every pair i < j, genuine when the finest labels agree: a double loop gives the same pairs."""
    monkeypatch.setattr(verification, "PAIR_CHUNK", pair_chunk)
    rng = np.random.default_rng(0)
    x = torch.nn.functional.normalize(torch.as_tensor(rng.normal(size=(40, 6))), dim=1)
    labels = np.stack([rng.integers(0, 6, 40), np.zeros(40, dtype=int)], axis=1)  # (N, 2): column 0 is used
    scores, genuine = [], []
    for i in range(40):
        for j in range(i + 1, 40):
            scores.append(float(x[i] @ x[j]))
            genuine.append(int(labels[i, 0] == labels[j, 0]))
    fars = (1e-2, 1e-1, 0.5)
    expected = tar_at_far(np.array(scores), np.array(genuine), fars)
    got = verification.all_pairs_tar_at_far(x, labels, fars)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-12)


def test_far_metric_names_are_parsed_strictly():
    names, fars = verification.parse_far_keys(["map@r", "tar@far=1e-03", "tar@far=1e-01"])
    assert names == ["map@r"] and fars == [1e-3, 1e-1]
    with pytest.raises(ValueError, match="'tar@far=1e-03'"):
        verification.parse_far_keys(["tar@far=0.001"])
    with pytest.raises(ValueError, match="expected tar@far"):
        verification.parse_far_keys(["tar@far=often"])
    with pytest.raises(ValueError, match="labels must have"):
        verification.all_pairs_tar_at_far(torch.zeros(3, 2), np.zeros(4))
