"""The explicit state of one ``rankopt fit`` (:class:`FitState`), filled stage by stage (:mod:`rankopt.fit.run`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.export.runtimes import Runtime
from rankopt.fit.clock import Clock
from rankopt.fit.framing import FramingChoice
from rankopt.fit.photos import Photos
from rankopt.fit.post import PostChoice
from rankopt.fit.settings import FitSettings
from rankopt.fit.sizing import Sizing
from rankopt.fit.trunk import TailStates
from rankopt.fit.tune import BestState, TuneResult
from rankopt.fit.validation import Pipeline


@dataclass
class FitState:
    """The explicit state of one fit, filled stage by stage."""

    settings: FitSettings
    source: str
    folder: Path
    clock: Clock
    device: torch.device
    photos: Photos
    skipped: list[str] = field(default_factory=list)
    """The unreadable photos left out (``RUN/skipped.txt``)."""
    checkpoint: Path = Path()
    net: Any = None
    cfg: Any = None
    trunk: Any = None
    frozen_net: Any = None
    frozen_trunk: Any = None
    runtime: Runtime | None = None
    states: TailStates | None = None
    sizing: Sizing | None = None
    pass_s: float = 0.0
    rate: float = 1.0
    framing: FramingChoice = field(default_factory=lambda: FramingChoice(""))
    pretrained_embeddings: torch.Tensor | None = None
    """The pretrained model's embedding of every photo (the ``features`` pipelines')."""
    pipelines: list[Pipeline] = field(default_factory=list)
    choices: dict[tuple[str, str], PostChoice] = field(default_factory=dict)
    tuned: TuneResult | None = None
    no_time_to_tune: str = ""
    """Why the fine-tuning had no time, with the ``--minutes`` that would give it some (empty when it had)."""
    tuned_states: dict[str, BestState] = field(default_factory=dict)
    served: Pipeline | None = None
    why: list[str] = field(default_factory=list)
    refit: dict[str, Any] | None = None
    scratch: Path = Path()
    """A temporary folder for the fit's spilled files (removed when it ends)."""
    post_s: float = 0.0
    score_s: float = 0.0
    """Seconds of one scoring of the validation protocols (the features alone); with the tail's pass over the
    validation photos, each tuning candidate's least cost."""
    tail_s: float = 0.0
    """Seconds of one pass of every photo through the tail (the index's embedding)."""

    @property
    def split(self):
        return self.photos.split

    @property
    def all_rows(self) -> np.ndarray:
        return np.arange(len(self.photos.labels))
