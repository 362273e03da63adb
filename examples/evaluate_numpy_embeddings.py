"""Evaluate embeddings you already have: numpy arrays and labels in, ``rankopt.metrics.evaluate`` metrics out.

Queries and a gallery (float32 ``(N, D)`` arrays, integer labels) go in as torch tensors; R@1, mAP@R and mAP come
out, and the script checks them against a brute-force numpy computation of the same definitions (cosine
similarity, every gallery item ranked, AP over all the positives, mAP@R over the first R results).

Run it from the repository root: ``python examples/evaluate_numpy_embeddings.py`` (a second or two on a CPU).
"""

import numpy as np
import torch

from rankopt.metrics import evaluate

rng = np.random.default_rng(0)
classes, dim = 30, 24
centres = rng.normal(size=(classes, dim))
gallery_labels = np.repeat(np.arange(classes), 8)  # 8 gallery items per class
query_labels = rng.integers(0, classes, size=100)
gallery = (centres[gallery_labels] + 1.2 * rng.normal(size=(len(gallery_labels), dim))).astype(np.float32)
queries = (centres[query_labels] + 1.2 * rng.normal(size=(len(query_labels), dim))).astype(np.float32)

result = evaluate(torch.from_numpy(queries), torch.from_numpy(query_labels),
                  torch.from_numpy(gallery), torch.from_numpy(gallery_labels), metrics=["recall@1", "map@r", "map"])
print(f"{result.num_queries} queries, {len(gallery)} gallery items")
for name, value in result.metrics.items():
    print(f"  {name:9s} {value:.4f}")


def brute_force(queries: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray,
                gallery_labels: np.ndarray) -> dict[str, float]:
    """The three metrics from their definitions, one query at a time."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    scores = unit(queries.astype(np.float64)) @ unit(gallery.astype(np.float64)).T
    r1, map_r, ap = [], [], []
    for q in range(len(queries)):
        relevant = gallery_labels[np.argsort(-scores[q], kind="stable")] == query_labels[q]  # in ranked order
        hits = np.cumsum(relevant)
        precision = hits / np.arange(1, len(relevant) + 1)
        r = relevant.sum()  # the number of positives
        r1.append(float(relevant[0]))
        map_r.append((precision[:r] * relevant[:r]).sum() / r)
        ap.append((precision * relevant).sum() / r)
    return {"recall@1": np.mean(r1), "map@r": np.mean(map_r), "map": np.mean(ap)}


expected = brute_force(queries, query_labels, gallery, gallery_labels)
print("brute force:", ", ".join(f"{name} {value:.4f}" for name, value in expected.items()))
for name, value in expected.items():
    assert abs(result.metrics[name] - value) < 1e-5, (name, result.metrics[name], value)
assert result.num_queries == len(queries) and result.num_queries_without_positive == 0
