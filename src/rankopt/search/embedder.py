"""Images -> embeddings with a model and the preprocessing that joins its fingerprint.

An :class:`Embedder` holds a model in eval mode, the transform its test embeddings are made
with, and ``preprocessing``: the JSON-able settings besides the weights that shape an embedding
(test transform preset and image size, and with :meth:`Embedder.with_postprocessing` the
multi-scale scales and the whitening of :mod:`rankopt.postprocess`).
``fingerprint = rankopt.models.fingerprint.model_fingerprint(model, preprocessing)``, so two
embedders give comparable embeddings only when their fingerprints are equal. An ONNX export
(:meth:`Embedder.from_onnx`, run by onnxruntime) carries its checkpoint's fingerprint and preprocessing.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankopt.data.base import RetrievalDataset
from rankopt.data.transforms import build_transform
from rankopt.data.image_folder import folder_dataset, images_dataset
from rankopt.data.readable import without_unreadable
from rankopt.engine.assembly import (
    inference_preprocessing,
    model_from_checkpoint,
    resolve_device,
)
from rankopt.engine.embed_and_score import EmbeddedSplit, embed_dataset
from rankopt.describe import model_info
from rankopt.data.reader import READ_THREADS
from rankopt.export.onnx_net import OnnxNet
from rankopt.export.runtimes import TIMED_BATCH_MAX, TORCH, Runtime, default_runtime, prepare_network
from rankopt.models.fingerprint import model_fingerprint
from rankopt.postprocess import MULTISCALE_KEY, WHITENING_KEY, PostProcessing, Whitening
from rankopt.search.settings import EMBED

ImageSource = RetrievalDataset | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""A dataset, an image file or folder, or a list of them."""


def transform_from_preprocessing(preprocessing: Mapping[str, Any]) -> Callable[..., torch.Tensor]:
    """The test transform named by ``preprocessing`` (``{"transform": PRESET, "image_size": PX}``,
    as :func:`rankopt.engine.assembly.inference_preprocessing` writes it)."""
    if "transform" not in preprocessing:
        raise ValueError(f"preprocessing {dict(preprocessing)} names no transform preset (key 'transform'); "
                         "pass transform= as well")
    return build_transform(preprocessing["transform"], preprocessing.get("image_size"))


@dataclass
class Embedder:
    """A model with its transform and preprocessing settings; ``fingerprint`` identifies the pair."""

    model: nn.Module
    transform: Callable[..., torch.Tensor]
    preprocessing: dict[str, Any]
    device: torch.device
    checkpoint: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    batch_size: int = EMBED.batch_size
    num_workers: int = EMBED.num_workers
    progress: bool = True
    post: PostProcessing | None = None
    """Multi-scale embedding and whitening applied to every embedding (set by :meth:`with_postprocessing`)."""
    runtime: str = TORCH
    """``auto``, ``torch`` or ``onnx``: what runs the forward (:mod:`rankopt.export.runtimes`; a checkpoint's
    embedder defaults to ``$RANKOPT_RUNTIME`` or ``auto``, a live ``nn.Module``'s to ``torch``)."""
    threads: int | None = None
    """onnxruntime's intra-op threads (default: torch's thread count)."""
    read_threads: int = READ_THREADS
    """Threads reading the next images during the forward (:func:`rankopt.data.reader.read_ahead`; 0: none)."""
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, OnnxNet):
            self.fingerprint = model_fingerprint(self.model, self.preprocessing)
            return
        if self.preprocessing != self.model.preprocessing:  # e.g. multi-scale or whitening added
            raise ValueError(f"the ONNX model {self.model.path.name} embeds with its fixed preprocessing "
                             f"{self.model.preprocessing}, not {self.preprocessing}: multi-scale embedding and "
                             "whitening need the PyTorch checkpoint")
        self.fingerprint = self.model.fingerprint

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], *, device: str = EMBED.device, **options: Any) -> Embedder:
        """The checkpoint's model with its config's test transform and image size; an ``.onnx`` file
        (``rankopt export``) is run by onnxruntime (:meth:`from_onnx`)."""
        if Path(path).suffix.lower() == ".onnx":
            return cls.from_onnx(path, device=device, **options)
        options["runtime"] = options.get("runtime") or default_runtime()
        resolved = resolve_device(device)
        model, cfg = model_from_checkpoint(path, resolved)
        preprocessing = inference_preprocessing(cfg)
        return cls(model, transform_from_preprocessing(preprocessing), preprocessing, resolved,
                   checkpoint=str(Path(path).resolve()), summary=model_info(model, cfg.model.backbone), **options)

    @classmethod
    def from_onnx(cls, path: str | os.PathLike[str], *, device: str = EMBED.device, threads: int | None = None,
                  **options: Any) -> Embedder:
        """An ONNX model exported by ``rankopt export`` (:class:`rankopt.export.onnx_net.OnnxNet`, onnxruntime with
        ``threads`` intra-op threads on ``device``), with the test transform and the fingerprint stored in it:
        those of its checkpoint, so their embeddings are interchangeable."""
        net = OnnxNet(path, device=device, threads=threads)
        options.pop("runtime", None)  # the file fixes it
        return cls(net, transform_from_preprocessing(net.preprocessing), net.preprocessing, torch.device("cpu"),
                   checkpoint=str(Path(path).resolve()), summary=net.summary, threads=threads, **options)

    @classmethod
    def from_model(cls, model: nn.Module, *, transform: Callable[..., torch.Tensor] | None = None,
                   preprocessing: Mapping[str, Any] | None = None, device: str = EMBED.device,
                   **options: Any) -> Embedder:
        """``model`` (moved to ``device``) with ``preprocessing`` (required: it joins the fingerprint) and
        ``transform`` (default: built from ``preprocessing["transform"]`` and ``["image_size"]``)."""
        if preprocessing is None:
            raise ValueError("a model given as an nn.Module needs preprocessing={'transform': PRESET, "
                             "'image_size': PX, ...}: the settings besides the weights that shape its embeddings "
                             "(they join the fingerprint); a checkpoint path brings its own")
        preprocessing = dict(preprocessing)
        resolved = resolve_device(device)
        backbone = type(getattr(model, "backbone", model)).__name__
        return cls(model.to(resolved), transform or transform_from_preprocessing(preprocessing), preprocessing,
                   resolved, summary=model_info(model, backbone), **options)

    def with_postprocessing(self, post: PostProcessing | None) -> Embedder:
        """This embedder with ``post``'s multi-scale and whitening steps: they shape every embedding and
        join ``preprocessing`` (hence the fingerprint). A whitening fitted for another model, test
        transform or multi-scale setting is refused. DBA and αQE act on sets, not here."""
        if post is None or (post.scales is None and post.whitening is None):
            return self
        if self.post is not None:
            raise ValueError("this embedder already has post-processing steps")
        steps = post.embedding_steps()
        if steps.whitening is not None:
            steps.whitening.check_model(self.fingerprint, steps.scales)
        return dataclasses.replace(self, post=steps, preprocessing={**self.preprocessing, **steps.preprocessing()})

    def require_fingerprint(self, fingerprint: str, preprocessing: Mapping[str, Any], what: str = "the index") -> None:
        """Raise a ``ValueError`` unless this embedder's fingerprint is ``fingerprint`` (the one of ``what``,
        made with ``preprocessing``), saying whether the weights or the preprocessing differ."""
        if self.fingerprint == fingerprint:
            return
        differences = [f"{key}: {preprocessing.get(key)!r} there, {self.preprocessing.get(key)!r} here"
                       for key in sorted(set(preprocessing) | set(self.preprocessing))
                       if preprocessing.get(key) != self.preprocessing.get(key)]
        if not differences:
            cause = "the weights differ (same preprocessing)"
        elif model_fingerprint(self.model, preprocessing) == fingerprint:
            cause = f"same weights, the preprocessing differs ({'; '.join(differences)})"
        else:
            cause = f"the weights differ and so does the preprocessing ({'; '.join(differences)})"
        raise ValueError(f"the model's fingerprint {self.fingerprint} is not the fingerprint {fingerprint} of "
                         f"{what}: {cause}; its embeddings are not comparable")

    @functools.cached_property
    def _prepared(self) -> tuple[nn.Module, Runtime]:
        if isinstance(self.model, OnnxNet):
            return self.model, Runtime("onnxruntime", self.threads or torch.get_num_threads(),
                                       self.model.runtime_device, f"the ONNX file {self.model.path.name}")
        network = self.model if self.post is None else self.post.wrap_model(self.model)
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if self.progress else None
        # the whitening applies to the network's outputs, outside it: one export serves every whitening of a model
        computed = {k: v for k, v in self.preprocessing.items() if k != WHITENING_KEY}
        key = self.fingerprint if computed == self.preprocessing else model_fingerprint(self.model, computed)
        return prepare_network(network, computed, key, runtime=self.runtime,
                               device=self.device, threads=self.threads, summary=self.summary, say=say,
                               batch=min(self.batch_size, TIMED_BATCH_MAX))

    @property
    def network(self) -> nn.Module:
        """The model with the multi-scale step of :attr:`post` (its whitening is applied to the outputs), on the
        runtime :attr:`runtime` asks for (prepared at first use: an ONNX export is made once per model)."""
        return self._prepared[0]

    @property
    def active_runtime(self) -> Runtime:
        """The runtime :attr:`network` runs on, its threads, and why it was chosen."""
        return self._prepared[1]

    def embed(self, images: ImageSource, *, desc: str = "embedding",
              unreadable: dict[int, str] | None = None) -> EmbeddedSplit:
        """Embeddings ``(N, D)`` of ``images`` (a dataset is embedded with this embedder's transform);
        ``unreadable``: the items whose image cannot be read are left out and recorded there
        (:func:`rankopt.engine.embed_and_score.embed_dataset`)."""
        dataset = as_dataset(images, self.transform)
        split = embed_dataset(self.network, dataset, batch_size=self.batch_size, device=self.device,
                              num_workers=self.num_workers, show_progress=self.progress, desc=desc,
                              read_threads=self.read_threads, unreadable=unreadable)
        if self.post is not None:
            split.embeddings = self.post.whiten(split.embeddings)
        return split

    def embed_images(self, images: ImageSource, *, desc: str = "embedding",
                     skipped: list[str] | None = None) -> tuple[RetrievalDataset, EmbeddedSplit]:
        """``(the dataset of images, its embeddings)`` (one folder: its class tree). ``skipped``: the images that
        cannot be read are left out, found by the pass itself so that each is decoded once
        (:mod:`rankopt.data.readable`; a folder's class tree is rebuilt from the readable images), one line each
        appended there ("PATH: why"); none readable is a ``ValueError``. Without it such an image raises."""
        dataset = as_dataset(images, self.transform, class_tree=True)
        if skipped is None:
            return dataset, self.embed(dataset, desc=desc)
        bad: dict[int, str] = {}
        split = self.embed(dataset, desc=desc, unreadable=bad)
        readable, lines = without_unreadable(images, dataset, bad)
        skipped.extend(lines)
        if bad:
            assert split.paths == readable.paths, "the readable dataset lists the embedded items in their order"
            split = EmbeddedSplit(split.embeddings, torch.as_tensor(readable.labels, dtype=torch.long),
                                  list(readable.paths), dict(readable.metadata))
        return readable, split

    @torch.inference_mode()
    def embed_batch(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` images already transformed -> ``(B, D)`` embeddings, as :meth:`embed` makes them
        (the model as it is: in eval mode for a service)."""
        out = self.network(images.to(self.device)).float().cpu()
        return out if self.post is None else self.post.whiten(out)


def base_preprocessing(preprocessing: Mapping[str, Any]) -> dict[str, Any]:
    """``preprocessing`` without the post-processing entries (what a checkpoint's config gives)."""
    return {k: v for k, v in preprocessing.items() if k not in (MULTISCALE_KEY, WHITENING_KEY)}


def stored_post(preprocessing: Mapping[str, Any], whitening: Whitening | None) -> PostProcessing | None:
    """The multi-scale and whitening steps of a stored embedding pipeline (its ``preprocessing`` names the
    scales), or ``None``."""
    scales = preprocessing.get(MULTISCALE_KEY)
    return PostProcessing(tuple(scales) if scales else None, whitening) if scales or whitening is not None else None


def as_dataset(images: ImageSource, transform: Callable[..., torch.Tensor], *,
               class_tree: bool = False) -> RetrievalDataset:
    """``images`` as a :class:`RetrievalDataset` with ``transform`` (a dataset is copied, never modified).

    Image files and folders are unlabelled (``rankopt.data.image_folder.images_dataset``), except one
    folder with ``class_tree``: labelled by its class folders (``image_folder.folder_dataset``).
    """
    if isinstance(images, RetrievalDataset):
        dataset = copy.copy(images)
        dataset.transform = transform
        return dataset
    if isinstance(images, (str, os.PathLike)):
        if class_tree and Path(images).is_dir():
            return folder_dataset(images, transform)
        images = [images]
    return images_dataset(list(images), transform)
