"""The face protocol in rankopt.engine.embed_and_score.score: media-averaged self-retrieval and the IJB-C
1:1 verification TARs, on a SYNTHETIC split (media, templates, template pairs built here)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rankopt.config import EvalConfig
from rankopt.engine.embed_and_score import EmbeddedSplit, score
from rankopt.metrics import evaluate, verification_metrics

METRICS = ["recall@1", "map@r", "map"]


def face_split(seed: int = 0) -> EmbeddedSplit:
    """4 subjects, each with a video (2-4 frames) and two stills; media ids shuffled and sparse;
    2 templates per subject (video + still A, still A + still B: still A is in both); all template pairs."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 5)) * 1.5
    media_ids = rng.permutation(np.arange(10, 10 + 3 * 4 * 7, 7))
    embeddings, labels, media, templates = [], [], [], []
    for subject in range(4):
        video, still_a, still_b = media_ids[3 * subject : 3 * subject + 3]
        frames = int(rng.integers(2, 5))
        first = len(media)
        for m, count in ((video, frames), (still_a, 1), (still_b, 1)):
            embeddings.extend(centres[subject] + rng.normal(size=(count, 5)))
            labels.extend([subject] * count)
            media.extend([m] * count)
        video_items, a, b = range(first, first + frames), first + frames, first + frames + 1
        templates += [(2 * subject, i) for i in (*video_items, a)] + [(2 * subject + 1, a), (2 * subject + 1, b)]
    pairs = [(s, t, int(s // 2 == t // 2)) for s in range(8) for t in range(s + 1, 8)]  # 4 genuine, 24 impostor
    metadata = {"media": np.array(media, dtype=np.int64), "templates": np.array(templates, dtype=np.int64),
                "template_pairs": np.array(pairs, dtype=np.int64)}
    x = torch.tensor(np.array(embeddings), dtype=torch.float32)
    return EmbeddedSplit(x, torch.tensor(labels).unsqueeze(1), [f"img{i}.jpg" for i in range(len(media))], metadata)


def hand_averaged(split: EmbeddedSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per media (in order of first appearance): the mean of its items, and its label."""
    media = split.metadata["media"]
    order = list(dict.fromkeys(media.tolist()))
    x = split.embeddings.double().numpy()
    means = [x[media == m].mean(axis=0) for m in order]
    labels = [int(split.labels[media == m][0, 0]) for m in order]
    return torch.tensor(np.array(means), dtype=torch.float32), torch.tensor(labels).unsqueeze(1)


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_score_averages_media_and_adds_verification(similarity):
    split = face_split()
    cfg = EvalConfig(metrics=METRICS, similarity=similarity)
    result = score([split], cfg)
    means, labels = hand_averaged(split)
    expected = evaluate(means, labels, metrics=METRICS, similarity=similarity)
    assert result.num_queries == 12 == expected.num_queries
    for name in METRICS:
        assert result.metrics[name] == pytest.approx(expected.metrics[name], abs=1e-12)
    tars = verification_metrics(split.embeddings, split.metadata["media"], split.metadata["templates"],
                                split.metadata["template_pairs"], similarity=similarity)
    assert set(result.metrics) == set(METRICS) | set(tars)
    assert list(tars)[0] == "tar@far=1e-06" and list(tars)[-1] == "tar@far=1e-01"
    np.testing.assert_equal({k: result.metrics[k] for k in tars}, tars)
    assert not math.isnan(result.metrics["tar@far=1e-01"])  # 24 impostor pairs
    assert math.isnan(result.metrics["tar@far=1e-02"])  # fewer than 100


def test_media_averaging_changes_the_retrieval_set():
    split = face_split()
    frames = score([dataclasses.replace(split, metadata={})], EvalConfig(metrics=METRICS))
    media = score([dataclasses.replace(split, metadata={"media": split.metadata["media"]})], EvalConfig(metrics=METRICS))
    assert frames.num_queries == len(split.paths) > media.num_queries == 12
    assert not any(k.startswith("tar@") for k in media.metrics)  # no templates: retrieval metrics only
    expected = evaluate(split.embeddings, split.labels, metrics=METRICS)  # without media: as before
    assert frames.metrics == expected.metrics


def test_a_media_with_mixed_labels_is_named():
    split = face_split()
    labels = split.labels.clone()
    media = split.metadata["media"]
    video = media[0]  # the first subject's video has at least 2 frames
    second_frame = int(np.flatnonzero(media == video)[1])
    labels[second_frame, 0] = 3
    bad = dataclasses.replace(split, labels=labels)
    with pytest.raises(ValueError, match=rf"media {video} mixes labels: item 0 \(img0.jpg\).*item {second_frame}"):
        score([bad], EvalConfig(metrics=METRICS))


def test_media_in_a_query_gallery_evaluation_is_refused():
    split = face_split()
    with pytest.raises(ValueError, match="self-retrieval only"):
        score([split, dataclasses.replace(split, metadata={})], EvalConfig(metrics=METRICS))


def test_tar_at_far_names_verify_every_pair_of_a_self_retrieval_split():
    """Without templates (Yale B), ``tar@far=F`` in the metrics is TAR over all pairs of the split, beside the
    retrieval metrics; a query/gallery protocol is refused."""
    from rankopt.metrics.verification import all_pairs_tar_at_far

    gen = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(30, 5, generator=gen), dim=1)
    labels = torch.arange(30).div(5, rounding_mode="floor").unsqueeze(1)
    split = EmbeddedSplit(x, labels, [f"{i}.pgm" for i in range(30)])
    cfg = EvalConfig(metrics=["map@r", "tar@far=1e-01"])
    result = score([split], cfg)
    assert set(result.metrics) == {"map@r", "tar@far=1e-01"}
    assert result.metrics["tar@far=1e-01"] == all_pairs_tar_at_far(x, labels, (0.1,))["tar@far=1e-01"]
    with pytest.raises(ValueError, match="self-retrieval"):
        score([split, split], cfg)
