"""Learned whitening (rankopt.postprocess.whitening): exactness in float64, files, bad input, and
mAP gains on SYNTHETIC embeddings built so that whitening must help."""

from __future__ import annotations

import json

import pytest
import torch

from rankopt.postprocess import (
    Whitening,
    fit_pca_whitening,
    fit_supervised_whitening,
    load_whitening,
    matching_pairs,
    pair_covariance,
    save_whitening,
)
from rankopt.postprocess.whitening import shrink

from .helpers import mean_ap


def _correlated(n: int = 400, dim: int = 6, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mixing = torch.randn(dim, dim, generator=gen, dtype=torch.float64)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64) @ mixing + 3.0


def _projected(w: Whitening, x: torch.Tensor) -> torch.Tensor:
    """``P (x − m)`` before the final normalisation."""
    return (x.double() - w.mean) @ w.projection.T


def _cov(y: torch.Tensor) -> torch.Tensor:
    return torch.cov(y.T, correction=0)


def test_pca_whitening_makes_the_covariance_the_identity():
    x = _correlated()
    w = fit_pca_whitening(x, power=0.5, eps=0.0)
    assert w.projection.shape == (6, 6) and w.kind == "pca"
    assert torch.allclose(_cov(_projected(w, x)), torch.eye(6, dtype=torch.float64), atol=1e-10)
    out = w.apply(x.float())
    assert out.dtype == torch.float32 and torch.allclose(out.norm(dim=1), torch.ones(len(x)), atol=1e-6)


def test_power_quarter_gives_square_rooted_eigenvalues():
    x = _correlated()
    eigenvalues = torch.linalg.eigvalsh(_cov(x)).flip(0)
    w = fit_pca_whitening(x, power=0.25, eps=0.0)
    cov = _cov(_projected(w, x))
    assert torch.allclose(cov, torch.diag(eigenvalues.sqrt()), atol=1e-9)


def test_dim_keeps_the_leading_components():
    x = _correlated()
    full, top = fit_pca_whitening(x), fit_pca_whitening(x, dim=2)
    assert top.projection.shape == (2, 6) and torch.equal(top.projection, full.projection[:2])


def test_shrinkage_interpolates_between_pca_and_isotropic():
    x = _correlated()
    cov = _cov(x)
    iso = torch.trace(cov) / 6 * torch.eye(6, dtype=torch.float64)
    assert torch.allclose(shrink(cov, 0.3), 0.7 * cov + 0.3 * iso)
    w = fit_pca_whitening(x, shrinkage=1.0, eps=0.0)  # isotropic: a rotation scaled by (tr/D)^(-1/2)
    scaled = w.projection * (torch.trace(cov) / 6).sqrt()
    assert torch.allclose(scaled @ scaled.T, torch.eye(6, dtype=torch.float64), atol=1e-10)
    half = fit_pca_whitening(x, shrinkage=0.5, eps=0.0)  # whitens the shrunk covariance exactly
    assert torch.allclose(half.projection @ shrink(cov, 0.5) @ half.projection.T, torch.eye(6, dtype=torch.float64),
                          atol=1e-10)


def test_supervised_whitening_makes_the_pair_covariance_the_identity():
    gen = torch.Generator().manual_seed(1)
    labels = torch.arange(30).repeat_interleave(6)
    x = torch.randn(30, 5, generator=gen, dtype=torch.float64)[labels] * 3 + torch.randn(180, 5, generator=gen,
                                                                                          dtype=torch.float64)
    pairs = matching_pairs(labels, max_pairs_per_class=1000)
    assert len(pairs) == 30 * 15 and bool((labels[pairs[:, 0]] == labels[pairs[:, 1]]).all())
    w = fit_supervised_whitening(x, labels)
    diff = _projected(w, x[pairs[:, 0]]) - _projected(w, x[pairs[:, 1]])
    assert torch.allclose(diff.T @ diff / len(diff), torch.eye(5, dtype=torch.float64), atol=1e-10)
    cov = _cov(_projected(w, x))  # rotated so the total covariance is diagonal, descending
    assert torch.allclose(cov, torch.diag(cov.diag()), atol=1e-9) and bool((cov.diag().diff() <= 1e-12).all())


def test_a_shared_pair_covariance_gives_the_same_whitening_at_every_shrinkage():
    gen = torch.Generator().manual_seed(2)
    labels = torch.arange(12).repeat_interleave(5)
    x = torch.randn(12, 8, generator=gen)[labels] * 2 + torch.randn(60, 8, generator=gen)
    pairs = pair_covariance(x, labels, max_pairs_per_class=6, seed=1)
    diff = (x[matching_pairs(labels, max_pairs_per_class=6, seed=1)[:, 0]]
            - x[matching_pairs(labels, max_pairs_per_class=6, seed=1)[:, 1]]).double()
    assert pairs.pairs == 12 * 6 and torch.allclose(pairs.matrix, diff.T @ diff / len(diff), atol=1e-12)
    for shrinkage in (0.0, 0.1, 0.6):
        alone = fit_supervised_whitening(x, labels, shrinkage=shrinkage, max_pairs_per_class=6, seed=1)
        shared = fit_supervised_whitening(x, labels, shrinkage=shrinkage, pairs=pairs)
        assert torch.equal(alone.projection, shared.projection) and torch.equal(alone.mean, shared.mean)
    with pytest.raises(ValueError, match="pair covariance is"):
        fit_supervised_whitening(x[:, :4], labels, pairs=pairs)


def test_matching_pairs_cap_is_seeded():
    labels = torch.zeros(10, dtype=torch.long)
    a, b = matching_pairs(labels, max_pairs_per_class=7, seed=3), matching_pairs(labels, max_pairs_per_class=7, seed=3)
    assert len(a) == 7 and torch.equal(a, b) and len({tuple(p) for p in a.tolist()}) == 7
    assert not torch.equal(a, matching_pairs(labels, max_pairs_per_class=7, seed=4))


def test_save_load_round_trip_is_bit_identical(tmp_path):
    w = fit_pca_whitening(_correlated(), power=0.25, shrinkage=0.1, dim=4, fitted_on="toy/train")
    w = Whitening(w.mean, w.projection, w.kind, w.power, w.shrinkage, w.fitted_on, "0123456789abcdef", (1.0, 0.5))
    path = save_whitening(w, tmp_path / "w.safetensors")
    back = load_whitening(path)
    assert torch.equal(back.mean, w.mean) and torch.equal(back.projection, w.projection)
    assert back.metadata() == w.metadata() and back.digest() == w.digest()
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary file left


# --- helps where it must (SYNTHETIC) --------------------------------------------------------------

def _nuisance_dominated(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SYNTHETIC: 12 class dimensions of small variance, 4 nuisance dimensions (no class signal) of std 3."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(40).repeat_interleave(8)
    signal = 0.5 * torch.randn(40, 12, generator=gen)[labels] + 0.15 * torch.randn(320, 12, generator=gen)
    nuisance = 3.0 * torch.randn(320, 4, generator=gen)
    return torch.cat([signal, nuisance], dim=1) + 1.0, labels


def test_pca_whitening_raises_map_when_nuisance_dominates_the_variance():
    train, _ = _nuisance_dominated(seed=0)
    test, labels = _nuisance_dominated(seed=1)
    w = fit_pca_whitening(train, power=0.5)
    before, after = mean_ap(test, labels), mean_ap(w.apply(test), labels)
    assert after > before + 0.3, (before, after)


def _intra_class_nuisance(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SYNTHETIC: 8 class dimensions (centres std 1, within-class std 0.3) and 8 nuisance dimensions
    varying within each class with std 1: the total variance is the same in every direction."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(40).repeat_interleave(8)
    signal = torch.randn(40, 8, generator=gen)[labels] + 0.3 * torch.randn(320, 8, generator=gen)
    return torch.cat([signal, torch.randn(320, 8, generator=gen)], dim=1), labels


def test_supervised_whitening_beats_pca_when_the_nuisance_is_intra_class():
    train, train_labels = _intra_class_nuisance(seed=0)
    test, labels = _intra_class_nuisance(seed=1)
    pca = mean_ap(fit_pca_whitening(train).apply(test), labels)
    supervised = mean_ap(fit_supervised_whitening(train, train_labels).apply(test), labels)
    assert supervised > pca + 0.3, (pca, supervised)


# --- bad input ----------------------------------------------------------------------------------

def test_bad_inputs_are_named():
    x = _correlated().float()
    w = fit_pca_whitening(x)
    with pytest.raises(ValueError, match="7 dimensions; this whitening was fitted on 6"):
        w.apply(torch.randn(3, 7))
    bad = x.clone()
    bad[5, 2] = float("nan")
    with pytest.raises(ValueError, match="embeddings"):
        w.apply(bad)
    with pytest.raises(ValueError, match="training embeddings"):
        fit_pca_whitening(bad)
    with pytest.raises(ValueError, match="dim must be in"):
        fit_pca_whitening(x, dim=9)
    with pytest.raises(ValueError, match="shrinkage must be in"):
        fit_pca_whitening(x, shrinkage=1.5)
    with pytest.raises(ValueError, match="no class has two or more items"):
        fit_supervised_whitening(x, torch.arange(len(x)))
    with pytest.raises(ValueError, match="singular"):
        fit_supervised_whitening(torch.randn(6, 6), torch.tensor([0, 0, 1, 1, 2, 2]))


def test_whitening_for_another_model_or_scales_is_refused(tmp_path):
    w = fit_pca_whitening(_correlated())
    w = Whitening(w.mean, w.projection, w.kind, w.power, w.shrinkage, "toy", "aaaaaaaaaaaaaaaa", None)
    back = load_whitening(save_whitening(w, tmp_path / "w.safetensors"))
    back.check_model("aaaaaaaaaaaaaaaa", None)
    with pytest.raises(ValueError, match="aaaaaaaaaaaaaaaa.*bbbbbbbbbbbbbbbb"):
        back.check_model("bbbbbbbbbbbbbbbb", None)
    with pytest.raises(ValueError, match="multi-scale"):
        back.check_model("aaaaaaaaaaaaaaaa", (1.0, 0.5))


def test_corrupt_or_incomplete_files_are_refused(tmp_path):
    from safetensors.torch import save_file

    missing = tmp_path / "missing.safetensors"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_whitening(missing)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_whitening(garbage)
    meta = {"rankopt_whitening": json.dumps({"kind": "pca", "dim": 3})}
    save_file({"mean": torch.zeros(4, dtype=torch.float64)}, str(tmp_path / "a.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="lacks tensor"):
        load_whitening(tmp_path / "a.safetensors")
    save_file({"mean": torch.zeros(4), "projection": torch.zeros(3, 5)}, str(tmp_path / "b.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        load_whitening(tmp_path / "b.safetensors")
    save_file({"mean": torch.zeros(4), "projection": torch.zeros(3, 4)}, str(tmp_path / "c.safetensors"))
    with pytest.raises(ValueError, match="metadata"):
        load_whitening(tmp_path / "c.safetensors")
    nan = torch.zeros(3, 4)
    nan[0, 0] = float("nan")
    save_file({"mean": torch.zeros(4), "projection": nan}, str(tmp_path / "d.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="finite"):
        load_whitening(tmp_path / "d.safetensors")
