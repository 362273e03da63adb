"""The model fingerprint changes with any weight or preprocessing setting, and only then."""

from __future__ import annotations

import torch

from rankopt.models import create_model
from rankopt.models.fingerprint import model_fingerprint


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("convnet_small", embedding_dim=8)


def test_fingerprint_depends_on_weights_and_preprocessing_only():
    a, b = _model(0), _model(0)
    pre = {"transform": "omniglot_test", "image_size": 32}
    assert model_fingerprint(a, pre) == model_fingerprint(b, dict(reversed(list(pre.items()))))
    assert len(model_fingerprint(a, pre)) == 16
    assert model_fingerprint(a, pre) != model_fingerprint(_model(1), pre)
    assert model_fingerprint(a, pre) != model_fingerprint(a, {**pre, "image_size": 64})
    assert model_fingerprint(a, pre) != model_fingerprint(a, {**pre, "scales": [1.0, 0.5]})
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-6  # one weight, barely changed
    assert model_fingerprint(a, pre) != model_fingerprint(b, pre)
