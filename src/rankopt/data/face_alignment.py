"""Face crops for the face datasets (``vggface2``, ``ijbc``): extended boxes and 5-point alignment.

* :func:`extend_box`: a face box grown by a fraction of its size, half of it on each side. The
  VGGFace2 authors crop their detector's box "extended by a factor 0.3 (except the extension outside
  image) to include the whole head" (ox-vgg/vgg_face2 README, Pre-processing); Smooth-AP §5.3 feeds
  SENet-50 "the same face crops (extended by the recommended amount)". The part outside the image is
  cut off when the crop is taken (:meth:`rankopt.data.base.RetrievalDataset.load`).
* :func:`similarity_transform`: the least-squares similarity (rotation, isotropic scale, shift; no
  reflection) taking one point set to another, Umeyama's closed form (IEEE TPAMI 13(4), 1991, Eqs.
  40-42).
* :func:`align_face`: the ArcFace crop of Smooth-AP §5.3 ("normalised face crops (112×112) ...
  align them with the predicted 5 facial key points"): the image warped by the similarity that takes
  its five landmarks to :data:`ARCFACE_TEMPLATE_112`, sampled bilinearly, black outside the image.

Points are pixel coordinates ``(x, y)`` with the centre of pixel ``(column i, row j)`` at ``(i, j)``
(OpenCV's convention, the one insightface's landmarks and template use).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from PIL import Image

ARCFACE_SIZE = 112
ARCFACE_TEMPLATE_112 = np.array(
    [[38.2946, 51.6963],   # left eye (image left)
     [73.5318, 51.5014],   # right eye
     [56.0252, 71.7366],   # nose tip
     [41.5493, 92.3655],   # left mouth corner
     [70.7299, 92.2041]],  # right mouth corner
    dtype=np.float64,
)
"""The five reference points of insightface's 112 x 112 ArcFace crop (``arcface_dst`` of its
``face_align``), in the landmark order of ``ijbc_name_5pts_score.txt``."""


def extend_box(x: float, y: float, width: float, height: float, factor: float) -> tuple[float, float, float, float]:
    """``(x1, y1, x2, y2)`` of the box ``(x, y, width, height)`` grown by ``factor`` times its width
    and height, half on each side: ``x1 = x - factor·width/2``, ``x2 = x + width + factor·width/2``."""
    if factor < 0:
        raise ValueError(f"box extension must be >= 0, got {factor}")
    dx, dy = factor * width / 2, factor * height / 2
    return (x - dx, y - dy, x + width + dx, y + height + dy)


def _points(values: ArrayLike, what: str) -> np.ndarray:
    points = np.asarray(values, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2 or points.shape[0] < 2 or not np.isfinite(points).all():
        raise ValueError(f"{what} must be a finite (K, 2) array of K >= 2 (x, y) points, got shape {points.shape}")
    return points


def similarity_transform(src_points: ArrayLike, dst_points: ArrayLike) -> np.ndarray:
    """The ``(2, 3)`` matrix ``[s·R | t]`` minimising ``Σ_k ||dst_k - (s·R·src_k + t)||²`` over rotations
    ``R`` (``det R = +1``), scales ``s >= 0`` and shifts ``t`` (Umeyama 1991, Eqs. 40-42):
    with the centred points and ``Σ = cov(dst, src) = U·D·Vᵀ``, ``S = diag(1, ±1)`` (-1 when
    ``det U · det V < 0``, which excludes a reflection), ``R = U·S·Vᵀ``, ``s = tr(D·S) / var(src)``,
    ``t = mean(dst) - s·R·mean(src)``."""
    src, dst = _points(src_points, "src_points"), _points(dst_points, "dst_points")
    if src.shape != dst.shape:
        raise ValueError(f"src_points {src.shape} and dst_points {dst.shape} differ in shape")
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_centred, dst_centred = src - src_mean, dst - dst_mean
    src_variance = float((src_centred**2).sum()) / len(src)
    if src_variance == 0.0:
        raise ValueError("src_points all coincide: no similarity is defined")
    u, singular, vt = np.linalg.svd(dst_centred.T @ src_centred / len(src))
    signs = np.array([1.0, -1.0 if np.linalg.det(u) * np.linalg.det(vt) < 0 else 1.0])
    rotation = u @ np.diag(signs) @ vt
    scale = float(singular @ signs) / src_variance
    shift = dst_mean - scale * rotation @ src_mean
    return np.hstack([scale * rotation, shift[:, None]])


def align_face(image: Image.Image, landmarks: ArrayLike, size: int = ARCFACE_SIZE) -> Image.Image:
    """``image`` warped to a ``size`` x ``size`` crop whose five ``landmarks`` (``(5, 2)``, order of
    :data:`ARCFACE_TEMPLATE_112`) fall on the template scaled by ``size / 112``: the output pixel at
    ``p`` samples the input at ``M⁻¹(p)``, ``M`` = :func:`similarity_transform` (landmarks, template),
    bilinearly (PIL ``Image.transform``, AFFINE)."""
    points = _points(landmarks, "landmarks")
    if points.shape != (5, 2):
        raise ValueError(f"landmarks must be (5, 2), got {points.shape}")
    if size < 1:
        raise ValueError(f"align size must be >= 1, got {size}")
    matrix = similarity_transform(points, ARCFACE_TEMPLATE_112 * (size / ARCFACE_SIZE))
    inverse = np.linalg.inv(matrix[:, :2])
    # PIL maps output position u (pixel centres at index + 0.5) to input position data·(u, 1), also
    # centre-at-half: u_in = M⁻¹(u_out - 0.5) + 0.5 in the centre-at-integer coordinates above.
    offset = 0.5 - inverse @ (matrix[:, 2] + 0.5)
    data = (inverse[0, 0], inverse[0, 1], offset[0], inverse[1, 0], inverse[1, 1], offset[1])
    return image.transform((size, size), Image.Transform.AFFINE, data, resample=Image.Resampling.BILINEAR)
