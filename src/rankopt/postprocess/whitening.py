"""Learned whitening of embeddings: PCA whitening and supervised (Lw) whitening.

Both learn ``x ↦ normalize(P (x − m))`` from embeddings of a training split; fitting runs in
float64. Files are safetensors with tensors ``mean`` ``(D,)`` and ``projection`` ``(d, D)`` and a
JSON metadata entry ``rankopt_whitening`` (kind, power, shrinkage, dim, what it was fitted on,
the multi-scale setting of those embeddings and the model fingerprint they belong to).

* PCA whitening (Jégou & Chum, ECCV 2012): ``Σ = (1/N) Σ_n (x_n − m)(x_n − m)ᵀ = V diag(λ) Vᵀ``,
  ``P = diag((λ + ε)^(−power)) Vᵀ`` (rows: the top ``dim`` components). ``power = 0.5`` whitens
  fully; ``power = 0.25`` is the square-rooted PCA of Revaud et al. (ICCV 2019, §5 "Descriptor
  whitening").
* Supervised whitening (Radenović et al., ECCV 2016 "CNN image retrieval learns from BoW",
  "learned whitening" Lw; TPAMI 2018): ``C_S = (1/|pairs|) Σ_(i,j) (x_i − x_j)(x_i − x_j)ᵀ`` over
  matching pairs, ``W = L⁻¹`` with ``C_S = L Lᵀ`` (Cholesky, as their code, so ``W C_S Wᵀ = I``),
  then the rotation ``U`` (eigenvalues descending) of the covariance of ``W (x − m)`` over all
  items: ``P = Uᵀ W``.

Shrinkage ``β`` regularises the covariance being whitened (``Σ``, resp. ``C_S``):
``Σ ← (1 − β) Σ + β (tr Σ / D) I``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rankopt.checks import check_embeddings, check_labels
from rankopt.models.fingerprint import FINGERPRINT_DIGITS, tensor_digest

KINDS = ("pca", "supervised")
METADATA_KEY = "rankopt_whitening"
EIGENVALUE_EPS = 1e-9


@dataclass(frozen=True)
class Whitening:
    """A learned whitening ``x ↦ normalize(P (x − m))``: ``mean`` ``(D,)``, ``projection`` ``(d, D)`` (float64).

    ``model_fingerprint`` and ``scales``: the model (``rankopt.models.fingerprint.model_fingerprint``
    of its weights and inference preprocessing) and the multi-scale setting of the embeddings it
    was fitted on (None: unknown / single scale).
    """

    mean: torch.Tensor
    projection: torch.Tensor
    kind: str
    power: float | None
    shrinkage: float
    fitted_on: str = ""
    model_fingerprint: str | None = None
    scales: tuple[float, ...] | None = None

    @property
    def input_dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def dim(self) -> int:
        return int(self.projection.shape[0])

    def apply(self, x: torch.Tensor, name: str = "embeddings") -> torch.Tensor:
        """``normalize(P (x − m))`` of ``x`` ``(N, D)``, computed in float64, returned in ``x``'s dtype."""
        check_embeddings(x, name)
        if x.shape[1] != self.input_dim:
            raise ValueError(f"{name} have {x.shape[1]} dimensions; this whitening was fitted on {self.input_dim}")
        y = (x.detach().double().cpu() - self.mean) @ self.projection.T
        return F.normalize(y, dim=1).to(dtype=x.dtype, device=x.device)

    def metadata(self) -> dict[str, Any]:
        """The JSON-able settings stored in the file (everything but the tensors)."""
        return {"kind": self.kind, "power": self.power, "shrinkage": self.shrinkage, "dim": self.dim,
                "input_dim": self.input_dim, "fitted_on": self.fitted_on,
                "model_fingerprint": self.model_fingerprint,
                "scales": None if self.scales is None else list(self.scales)}

    def digest(self) -> str:
        """sha256 of ``mean`` and ``projection`` (``tensor_digest``), first 16 hex digits."""
        return tensor_digest({"mean": self.mean, "projection": self.projection}).hexdigest()[:FINGERPRINT_DIGITS]

    def check_model(self, model_fingerprint: str, scales: tuple[float, ...] | None, source: str = "whitening") -> None:
        """Refuse embeddings of another model, preprocessing or multi-scale setting than it was fitted on
        (a whitening fitted without a recorded fingerprint only has its scales checked)."""
        if self.model_fingerprint is not None and self.model_fingerprint != model_fingerprint:
            raise ValueError(f"{source} was fitted for model fingerprint {self.model_fingerprint}; this model's "
                             f"fingerprint is {model_fingerprint} (other weights or test transform): refit it")
        if _scales_key(self.scales) != _scales_key(scales):
            raise ValueError(f"{source} was fitted on embeddings with multi-scale {_scales_text(self.scales)}; "
                             f"these use {_scales_text(scales)}: use the same --multiscale or refit it")


def _scales_key(scales: tuple[float, ...] | None) -> tuple[float, ...]:
    return (1.0,) if scales is None else tuple(round(s, 6) for s in scales)


def _scales_text(scales: tuple[float, ...] | None) -> str:
    return "off (scale 1)" if scales is None else str([round(s, 4) for s in scales])


def shrink(cov: torch.Tensor, shrinkage: float) -> torch.Tensor:
    """``(1 − β) Σ + β (tr Σ / D) I``: interpolates between ``Σ`` and an isotropic covariance of the same
    trace."""
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")
    if shrinkage == 0.0:
        return cov
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    return (1.0 - shrinkage) * cov + shrinkage * (torch.trace(cov) / cov.shape[0]) * eye


def sorted_eigh(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (descending, clamped at 0) and eigenvectors (columns) of a symmetric matrix, each
    vector's sign fixed so its largest-magnitude entry is positive (deterministic files)."""
    values, vectors = torch.linalg.eigh((cov + cov.T) / 2)
    values, vectors = values.flip(0).clamp(min=0.0), vectors.flip(1)
    pivot = vectors.abs().argmax(dim=0, keepdim=True)
    return values, vectors * vectors.gather(0, pivot).sign()


def _check_dim(dim: int | None, size: int) -> int:
    if dim is None:
        return size
    if not 1 <= dim <= size:
        raise ValueError(f"whitening dim must be in [1, {size}] (the embedding dimension), got {dim}")
    return dim


def _training_embeddings(x: torch.Tensor) -> torch.Tensor:
    check_embeddings(x, "training embeddings", min_rows=2)
    return x.detach().cpu().double()


def fit_pca_whitening(x: torch.Tensor, *, power: float = 0.5, shrinkage: float = 0.0, dim: int | None = None,
                      eps: float = EIGENVALUE_EPS, fitted_on: str = "") -> Whitening:
    """PCA whitening of ``x`` ``(N, D)``: ``P = diag((λ + ε)^(−power)) Vᵀ`` (top ``dim`` rows) of the
    (shrunk) covariance ``Σ = (1/N) Σ_n (x_n − m)(x_n − m)ᵀ = V diag(λ) Vᵀ`` (Jégou & Chum 2012)."""
    if not 0.0 < power <= 1.0:
        raise ValueError(f"whitening power must be in (0, 1], got {power}")
    data = _training_embeddings(x)
    dim = _check_dim(dim, data.shape[1])
    mean = data.mean(dim=0)
    centred = data - mean
    values, vectors = sorted_eigh(shrink(centred.T @ centred / data.shape[0], shrinkage))
    projection = (values[:dim] + eps).pow(-power).unsqueeze(1) * vectors[:, :dim].T
    return Whitening(mean, projection, "pca", float(power), float(shrinkage), fitted_on)


def matching_pairs(labels: torch.Tensor | np.ndarray, *, max_pairs_per_class: int = 1000,
                   seed: int = 0) -> torch.Tensor:
    """``(P, 2)`` int64 index pairs ``(i, j)``, ``i < j``, of items with the same label (column 0, the
    finest, of ``(N, L)`` labels): every pair of each class, or ``max_pairs_per_class`` of them drawn
    without replacement with ``seed`` when a class has more."""
    if max_pairs_per_class < 1:
        raise ValueError(f"max_pairs_per_class must be >= 1, got {max_pairs_per_class}")
    column = np.asarray(labels)
    column = column[:, 0] if column.ndim == 2 else column
    rng = np.random.default_rng(seed)
    order = np.argsort(column, kind="stable")
    _, starts, counts = np.unique(column[order], return_index=True, return_counts=True)
    pairs = []
    for start, count in zip(starts, counts):
        if count < 2:
            continue
        members = order[start : start + count]
        a, b = np.triu_indices(count, k=1)
        if a.size > max_pairs_per_class:
            keep = np.sort(rng.choice(a.size, max_pairs_per_class, replace=False))
            a, b = a[keep], b[keep]
        pairs.append(np.stack([members[a], members[b]], axis=1))
    if not pairs:
        raise ValueError("supervised whitening needs matching pairs, but no class has two or more items")
    return torch.from_numpy(np.concatenate(pairs)).long()


@dataclass(frozen=True)
class PairCovariance:
    """The intra-class covariance of matching pairs, ``C_S = (1/P) Σ_(i,j) (x_i − x_j)(x_i − x_j)ᵀ`` (float64),
    over the ``pairs`` of :func:`pair_covariance`: the costly part of a supervised whitening (``P x D²``), shared by
    fits that differ only in shrinkage or ``dim``."""

    matrix: torch.Tensor
    pairs: int


def pair_covariance(x: torch.Tensor, labels: torch.Tensor | np.ndarray, *, max_pairs_per_class: int = 1000,
                    seed: int = 0) -> PairCovariance:
    """:class:`PairCovariance` of ``x`` ``(N, D)`` over the matching pairs of ``labels`` (:func:`matching_pairs`)."""
    data = _training_embeddings(x)
    check_labels(torch.as_tensor(np.asarray(labels)), data.shape[0], "labels")
    pairs = matching_pairs(labels, max_pairs_per_class=max_pairs_per_class, seed=seed)
    diff = data[pairs[:, 0]] - data[pairs[:, 1]]
    return PairCovariance(diff.T @ diff / diff.shape[0], int(diff.shape[0]))


def fit_supervised_whitening(x: torch.Tensor, labels: torch.Tensor | np.ndarray, *, shrinkage: float = 0.0,
                             dim: int | None = None, max_pairs_per_class: int = 1000, seed: int = 0,
                             fitted_on: str = "", pairs: PairCovariance | None = None) -> Whitening:
    """Supervised whitening (Radenović et al. 2016, "learned whitening" Lw) of ``x`` ``(N, D)`` from the
    matching pairs of ``labels`` (:func:`matching_pairs`): ``P = Uᵀ W`` (top ``dim`` rows), ``W = L⁻¹``
    for the (shrunk) intra-class pair covariance ``C_S = L Lᵀ``, ``U`` the eigenvectors (eigenvalues
    descending) of the covariance of ``W (x − m)`` over all items. ``pairs``: ``C_S`` when already computed
    (:func:`pair_covariance` of the same ``x``, ``labels`` and pair settings)."""
    data = _training_embeddings(x)
    dim = _check_dim(dim, data.shape[1])
    if pairs is None:
        pairs = pair_covariance(data, labels, max_pairs_per_class=max_pairs_per_class, seed=seed)
    elif pairs.matrix.shape != (data.shape[1], data.shape[1]):
        raise ValueError(f"the pair covariance is {tuple(pairs.matrix.shape)}; the embeddings have {data.shape[1]} "
                         "dimensions")
    intra = shrink(pairs.matrix, shrinkage)
    factor, info = torch.linalg.cholesky_ex(intra)
    if int(info) != 0:
        raise ValueError(f"the intra-class covariance of {pairs.pairs} matching pairs is singular "
                         f"(dimension {data.shape[1]}); use a shrinkage > 0 or more pairs")
    whiten = torch.linalg.solve_triangular(factor, torch.eye(data.shape[1], dtype=data.dtype), upper=False)
    mean = data.mean(dim=0)
    whitened = (data - mean) @ whiten.T
    _, rotation = sorted_eigh(whitened.T @ whitened / data.shape[0])
    return Whitening(mean, rotation[:, :dim].T @ whiten, "supervised", None, float(shrinkage), fitted_on)


def save_whitening(whitening: Whitening, path: str | os.PathLike[str]) -> Path:
    """Write ``whitening`` as safetensors (tensors ``mean``, ``projection``; JSON metadata), atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tensors = {"mean": whitening.mean.contiguous(), "projection": whitening.projection.contiguous()}
    try:
        save_file(tensors, str(tmp), metadata={METADATA_KEY: json.dumps(whitening.metadata(), sort_keys=True)})
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_whitening(path: str | os.PathLike[str]) -> Whitening:
    """Read a file of :func:`save_whitening`, checked: tensors, shapes, dtypes, finite values, metadata."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"whitening file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except (SafetensorError, OSError) as err:
        raise ValueError(f"whitening file {str(path)!r} is not a readable safetensors file ({err})") from None
    missing = [key for key in ("mean", "projection") if key not in tensors]
    if missing:
        raise ValueError(f"whitening file {str(path)!r} lacks tensor(s) {', '.join(missing)}")
    try:
        meta = json.loads(metadata[METADATA_KEY])
        kind, dim = meta["kind"], int(meta["dim"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"whitening file {str(path)!r} has no valid {METADATA_KEY!r} metadata ({err!r})") from None
    mean, projection = tensors["mean"], tensors["projection"]
    if kind not in KINDS:
        raise ValueError(f"whitening file {str(path)!r}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    if mean.ndim != 1 or projection.ndim != 2 or projection.shape[1] != mean.shape[0] or projection.shape[0] != dim:
        raise ValueError(f"whitening file {str(path)!r}: inconsistent shapes mean {tuple(mean.shape)}, projection "
                         f"{tuple(projection.shape)} for dim {dim} (expected (D,) and ({dim}, D))")
    if not (mean.is_floating_point() and projection.is_floating_point()
            and bool(torch.isfinite(mean).all()) and bool(torch.isfinite(projection).all())):
        raise ValueError(f"whitening file {str(path)!r}: mean/projection must be finite floating-point tensors")
    scales = meta.get("scales")
    return Whitening(mean.double(), projection.double(), kind, meta.get("power"), float(meta.get("shrinkage", 0.0)),
                     str(meta.get("fitted_on", "")), meta.get("model_fingerprint"),
                     None if scales is None else tuple(float(s) for s in scales))


__all__ = ["KINDS", "Whitening", "fit_pca_whitening", "fit_supervised_whitening", "load_whitening",
           "matching_pairs", "save_whitening", "shrink", "sorted_eigh"]
