"""How the photos are framed for the network, chosen on the validation classes.

An ImageNet model's own test framing (``test``: the shorter side resized to 256, the central 224 × 224 kept)
keeps 87.5 % of the shorter side and less of the longer one, so an object photo loses its borders and often part
of its object. The alternative is the whole photo resized to the input size, its aspect not kept
(``landmark_test``, the test framing of ROADMAP and SupRank; :data:`WHOLE_PHOTO` names it for each input
convention). Each framing embeds the kept-back photos with the pretrained model, scored by self-retrieval
mAP@R per class (the pretrained model trained on none of the classes, so it has no known and new classes); the whole photo replaces the model's own framing only when its gain per class is
clear (:func:`rankopt.fit.post.per_class_gain`, as the served pipeline is chosen). The choice is the model's
test transform from then on: the trunk's cache, the saved model and the index's queries all use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from rankopt.data.base import RetrievalDataset
from rankopt.data.transforms import build_transform
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.fit.post import score_self_retrieval
from rankopt.fit.validation import SELECT_ON, per_class_gain

WHOLE_PHOTO = {"test": "landmark_test", "tf_lite_test": "tf_lite_whole_test"}
"""The whole-photo framing with the same input convention, for each centre-cropping test preset."""


@dataclass
class FramingChoice:
    """The chosen test preset, each candidate's validation mAP@R and why."""

    preset: str
    scores: dict[str, float] = field(default_factory=dict)
    note: str = ""

    def words(self) -> str:
        """The framing in two words where there was a choice (``""`` where the model has only its own)."""
        if not self.scores:
            return ""
        return "whole photo" if self.preset in WHOLE_PHOTO.values() else "centre crop"


def choose_framing(net: nn.Module, validation: RetrievalDataset, labels: np.ndarray, class_names: list[str],
                   own: str, image_size: object, *, device: torch.device, batch_size: int,
                   workers: int = 0) -> FramingChoice:
    """The framing of ``validation``'s photos (labels ``labels``, classes named ``class_names``) for ``net``:
    the model's ``own`` test preset, or its :data:`WHOLE_PHOTO` counterpart when that is clearly better."""
    whole = WHOLE_PHOTO.get(own)
    if whole is None:
        return FramingChoice(own, note=f"the model's own ({own}); no other framing for this input convention")
    scores, by_class = {}, {}
    names = [class_names[c] for c in labels]
    for preset in (own, whole):
        validation.transform = build_transform(preset, image_size)  # type: ignore[arg-type]
        x = embed_dataset(net, validation, batch_size=batch_size, device=device, num_workers=workers,
                          desc=f"framing ({preset})").embeddings
        metrics, by_class[preset] = score_self_retrieval(x, labels, categories=names)  # type: ignore[misc]
        scores[preset] = metrics[SELECT_ON]
    mean, se, clear = per_class_gain(by_class[own], by_class[whole])
    said = (f"the whole photo resized ({whole}) against the centre crop ({own}): {mean:+.4f} mAP@R per "
            f"validation class (standard error {se:.4f})")
    if clear:
        return FramingChoice(whole, scores, f"{said}: the whole photo is used")
    return FramingChoice(own, scores, f"{said}, not a clear gain: the model's own centre crop is kept")
