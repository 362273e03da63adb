"""Typed experiment configs, YAML recipes and ``key=value`` overrides.

An experiment is an :class:`ExperimentConfig` (dataclasses, one per section).
Recipes are YAML files in ``rankopt/recipes/`` (or any path); a recipe may start
from another one with a top-level ``base: <recipe>`` key. Recipes and
command-line overrides are merged onto the dataclass schema with OmegaConf, so an
unknown key or a value of the wrong type is an error naming the key::

    cfg = load_config("roadmap_sop_resnet50", ["train.batch_size=64", "optim.lr=2e-5"])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rankopt.checks import parse_image_size
from rankopt.registries import Registry

RECIPE_DIR = Path(__file__).resolve().parent / "recipes"
DEFAULT_RECIPE = "default"
DEFAULT_METRICS = ["recall@1", "recall@4", "recall@16", "map@r", "map"]


@dataclass
class DataConfig:
    """Dataset (``rankopt.data.build_dataset``) and its transforms."""

    name: str = "synthetic"
    root: str | None = None
    train_split: str = "train"
    eval_name: str | None = None  # evaluate on another dataset (e.g. train SfM-120k, test ROxford); None: name
    eval_root: str | None = None  # its folder; None: root
    eval_splits: list[str] | None = None  # None: rankopt.data.evaluation_splits(eval dataset); []: none
    train_transform: str = "synthetic_train"
    test_transform: str = "synthetic_test"
    image_size: Any = None  # None: the presets' size; S or "HxW" pixels (rankopt.checks.parse_image_size)
    batch_transform: bool = False  # transform whole batches on the device (same-size images, e.g. synthetic)
    num_workers: int | str = 0  # or "auto": resolved at start for the device (rankopt.runtime.resolve_auto)
    # > 0: hold out this fraction of the training split's classes at label column validation_level
    # (-1: coarsest, e.g. Omniglot alphabets) as a class-disjoint "validation" split, evaluated INSTEAD of
    # the evaluation splits: hyper-parameters are tuned there, never on the test classes.
    validation_fraction: float = 0.0
    validation_level: int = -1
    validation_seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """``rankopt.models.create_model`` arguments."""

    backbone: str = "convnet_small"
    pretrained: bool = False
    pooling: str = "avg"
    gem_p: float = 3.0
    gem_learnable: bool = True
    layer_norm: bool = False
    embedding_dim: int | None = None
    freeze_bn: bool = True
    # > 0: initialise the projection as the PCA of this many training descriptors (GLDv2 protocol, TPAMI §7)
    pca_init_images: int = 0
    # parameter-name prefixes not trained, e.g. [backbone.conv_stem, backbone.bn1, backbone.blocks.0]
    freeze: list[str] = field(default_factory=list)
    # a rankopt checkpoint (e.g. from `rankopt convert`) whose weights AND model architecture start a new run
    # (fresh optimizer, epoch 0); its architecture replaces this section's (rankopt.engine.assembly.adopt_init_model)
    init: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossTermConfig:
    """One term of a weighted sum of losses (``loss.terms``): ``weight · rankopt.losses.build(name, **kwargs)``."""

    name: str = ""
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossConfig:
    """``rankopt.losses.build(name, **kwargs)``; ``num_classes``/``embedding_dim`` are filled in when the loss declares
    them (``rankopt.losses.data_arguments``).

    A sum (``rankopt.losses.sums``): ``name=arcface+smooth_ap`` with ``kwargs`` keyed by term name, or ``terms``
    (name, weight, kwargs each) with ``name`` their names joined by ``+``. A ROD combination
    (``rankopt.losses.combination``) the same: ``kwargs: {lam: 0.5, sup_ap: {tau: 0.01}, calibration: {alpha: 0.9}}``.
    ``init``: ``random`` (the papers') or ``class_means`` (class weights from the class means of the training
    embeddings before training).
    ``relevance``: what the loss ranks by: ``none`` (the class labels), ``multilabel`` (items sharing any label of the
    data's multi-label items are relevant: a CSV's ``labels`` column) or ``multilabel_graded`` (the number of shared
    labels is the grade); the losses that take a ``Relevance`` only (``rankopt.engine.relevance_batches``).
    """

    name: str = "roadmap"
    kwargs: dict[str, Any] = field(default_factory=dict)
    terms: list[LossTermConfig] = field(default_factory=list)
    init: str = "random"
    relevance: str = "none"


@dataclass
class ScheduleConfig:
    """Learning-rate schedule: ``constant``, ``multistep``, ``cosine`` or ``linear``, with linear warm-up.

    ``milestones`` and ``warmup`` count epochs or steps according to ``interval``.
    Cosine: ``lr_t = min_lr_ratio·lr + (1 − min_lr_ratio)·lr·(1 + cos(π t/T))/2``;
    linear: ``lr_t = lr·(1 − (1 − min_lr_ratio)·t/T)``.
    """

    name: str = "constant"
    interval: str = "epoch"
    milestones: list[int] = field(default_factory=list)
    gamma: float = 0.1
    warmup: int = 0
    min_lr_ratio: float = 0.0


@dataclass
class OptimizerConfig:
    """One optimizer (``adam``, ``adamw`` or ``sgd``)."""

    name: str = "adam"
    lr: float = 1e-4
    weight_decay: float = 0.0
    momentum: float = 0.9
    nesterov: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class LossParamsOptimConfig(OptimizerConfig):
    """The loss parameters' (proxies', class weights') own optimizer and schedule (TPAMI: Adam, lr 10, cosine).

    ``with_model``: ``None``, as the loss's paper: class weights with a paper multiplier (ArcFace, CosFace,
    Sub-center ArcFace ×1, Proxy-Anchor ×100) join the model's optimizer at ``optim.lr`` × it, any other loss
    parameter takes this optimizer; ``true``: every loss parameter joins the model's optimizer (and schedule) at
    ``optim.lr × lr_mult``; ``false``: every one takes this optimizer. ``lr_mult``: ``None`` for the paper's (1 when
    it gives none).
    """

    lr: float = 10.0
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(name="cosine", interval="step"))
    with_model: bool | None = None
    lr_mult: float | None = None


@dataclass
class OptimConfig(OptimizerConfig):
    """Model optimizer: the backbone at ``lr``, the head at ``lr·head_lr_mult``.

    ``backbone_frozen_epochs``: the backbone is not updated for the first epochs (SupRank ``warmup_step``).
    """

    head_lr_mult: float = 1.0
    backbone_frozen_epochs: int = 0
    loss_params: LossParamsOptimConfig = field(default_factory=LossParamsOptimConfig)


@dataclass
class MemoryConfig:
    """Cross-batch memory (``rankopt.engine.memory.CrossBatchMemory``)."""

    enabled: bool = False
    size: int = 0  # 0: the number of training images
    warmup_steps: int = 0
    weight: float = 1.0


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64
    sampler: str = "m_per_class"
    m: int = 4
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)
    max_steps_per_epoch: int | None = None
    amp: str = "none"  # none | bf16 | fp16
    grad_clip: float | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    # multistaged backprop when < batch_size; "auto": sub-batches only when a batch's activations do not fit
    # (rankopt.runtime.resolve_auto, resolved at start into a number or null)
    sub_batch_size: int | str | None = None
    eval_every: int = 1
    best_metric: str = "map@r"
    seed: int = 0
    device: str = "auto"
    resume: str | None = None  # path or "auto"
    checkpoint_every_steps: int | None = None
    # per-step measurements logged as diag/<key> columns of steps.csv (rankopt.engine.diagnostics.DIAGNOSTICS),
    # every diagnostics_every steps, e.g. [surrogate_ap] for |surrogate AP - true AP| (Smooth-AP Fig. 4)
    diagnostics: list[str] = field(default_factory=list)
    diagnostics_every: int = 10


@dataclass
class EvalConfig:
    """The evaluations during training. ``relevance``: what they count as relevant: ``loss`` (the default: the
    loss's ``loss.relevance``), ``none`` (the class labels), ``multilabel`` or ``multilabel_graded`` (the evaluation
    splits' multi-label items, ``rankopt.engine.relevance_batches.split_relevance``)."""

    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    similarity: str = "cosine"
    chunk_size: int | None = None
    batch_size: int = 256
    relevance: str = "loss"


@dataclass
class OutputConfig:
    dir: str | None = None  # None: runs/<name>-<UTC time>
    tensorboard: bool = True  # TensorBoard when installed (an alias of "tensorboard" in loggers, which requires it)
    # experiment trackers (rankopt.engine.trackers): any of LOGGERS; each one's package is an optional extra
    loggers: list[str] = field(default_factory=list)
    mlflow_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else file:RUN/mlruns (offline, no server)
    wandb_project: str = "rankopt"  # W&B runs offline (RUN/wandb) unless $WANDB_MODE says otherwise
    log_checkpoints: bool = False  # also send checkpoints/best.ckpt to the trackers
    figures: bool = True  # figures and report.html
    # the figures drawn from the final embeddings (retrieval grid, PR curves, t-SNE map): the costly ones;
    # the benchmark draws them for its first seed only
    embedding_figures: bool = True
    map_points: int = 5000  # points of the t-SNE embedding map (its cost grows quickly with them)
    progress: bool = True


@dataclass
class ExperimentConfig:
    name: str = DEFAULT_RECIPE
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


_FREE_FORM = ("data.kwargs", "model.kwargs", "loss.kwargs", "train.sampler_kwargs")
_SCHEDULES = ("constant", "multistep", "cosine", "linear")
_CHOICES: dict[str, tuple[str, ...]] = {
    "optim.name": ("adam", "adamw", "sgd"),
    "optim.loss_params.name": ("adam", "adamw", "sgd"),
    "schedule.name": _SCHEDULES,
    "schedule.interval": ("epoch", "step"),
    "optim.loss_params.schedule.name": _SCHEDULES,
    "optim.loss_params.schedule.interval": ("epoch", "step"),
    "train.amp": ("none", "bf16", "fp16"),
    "model.pooling": ("avg", "max", "gem"),
    "eval.similarity": ("cosine", "dot", "neg_l2"),
    "loss.init": ("random", "class_means"),
    "loss.relevance": ("none", "multilabel", "multilabel_graded"),
    "eval.relevance": ("loss", "none", "multilabel", "multilabel_graded"),
}
LOGGERS = ("tensorboard", "mlflow", "wandb")  # output.loggers
_POSITIVE = ("train.batch_size", "train.m", "train.eval_every", "eval.batch_size", "train.diagnostics_every")


def list_recipes() -> list[str]:
    """Names of the recipes shipped in ``rankopt/recipes`` (the :data:`RECIPES` registry)."""
    return RECIPES.names()


def _recipe_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"recipe file {str(path)!r} does not exist")
        return path
    RECIPES.get(str(name_or_path))  # KeyError listing the known recipes
    return RECIPE_DIR / f"{str(name_or_path).lower()}.yaml"


def _load_raw(name_or_path: str | Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """A recipe's YAML merged onto its ``base`` recipes (untyped)."""
    path = _recipe_path(name_or_path)
    if path in seen:
        raise ValueError(f"recipe {path.name}: circular 'base' chain {' -> '.join(p.stem for p in (*seen, path))}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"recipe {path}: invalid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"recipe {path}: expected a mapping at the top level, got {type(raw).__name__}")
    base = raw.pop("base", None)
    conf = OmegaConf.create(raw)
    if base is None:
        return conf
    return _layer(_load_raw(base, (*seen, path)), conf, replace_kwargs=True)


def _layer(base: DictConfig, update: DictConfig, *, replace_kwargs: bool) -> DictConfig:
    """``update`` merged over ``base``. A new ``loss.name`` drops the base's ``loss.kwargs`` and ``loss.terms`` (a new
    ``train.sampler`` its ``train.sampler_kwargs``); with
    ``replace_kwargs`` (recipe over base recipe) every free-form ``*kwargs`` mapping given replaces the base's."""
    merged = OmegaConf.merge(base, update)
    for name_key, kwargs_key in (("loss.name", "loss.kwargs"), ("train.sampler", "train.sampler_kwargs")):
        new = OmegaConf.select(update, name_key)
        if new is not None and new != OmegaConf.select(base, name_key, default=None):
            OmegaConf.update(merged, kwargs_key, OmegaConf.select(update, kwargs_key, default={}), merge=False)
            if name_key == "loss.name" and OmegaConf.select(update, "loss.terms") is None:
                OmegaConf.update(merged, "loss.terms", [], merge=False)  # a list given is merged as it is
    for key in _FREE_FORM if replace_kwargs else ():
        value = OmegaConf.select(update, key, default=None)
        if value is not None:
            OmegaConf.update(merged, key, value, merge=False)
    return merged  # type: ignore[return-value]


def _merge(base: DictConfig, update: DictConfig, source: str, *, replace_kwargs: bool = False) -> DictConfig:
    """:func:`_layer` with OmegaConf's errors turned into ``ValueError``s naming the key."""
    try:
        return _layer(base, update, replace_kwargs=replace_kwargs)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        detail = str(err).splitlines()[0]
        if type(err).__name__ == "ConfigKeyError":
            raise ValueError(f"{source}: unknown config key {key!r} ({detail})") from None
        raise ValueError(f"{source}: invalid value for {key!r}: {detail}") from None


def _validate(conf: DictConfig) -> None:
    for key, choices in _CHOICES.items():
        value = OmegaConf.select(conf, key)
        if value not in choices:
            raise ValueError(f"invalid value for {key!r}: {value!r}; choose one of {', '.join(choices)}")
    for key in _POSITIVE:
        if OmegaConf.select(conf, key) < 1:
            raise ValueError(f"{key!r} must be >= 1, got {OmegaConf.select(conf, key)}")
    if conf.train.epochs < 0:
        raise ValueError(f"'train.epochs' must be >= 0 (0: evaluate the initial model only), got {conf.train.epochs}")
    if not 0.0 <= conf.data.validation_fraction < 1.0:
        raise ValueError(f"'data.validation_fraction' must be in [0, 1), got {conf.data.validation_fraction}")
    try:
        parse_image_size(conf.data.image_size)
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid value for 'data.image_size': {err}") from None
    workers = conf.data.num_workers
    if workers != "auto" and (isinstance(workers, str) or workers < 0):
        raise ValueError(f"'data.num_workers' must be >= 0 or auto, got {workers!r}")
    unknown = [name for name in conf.output.loggers if name not in LOGGERS]
    if unknown:
        raise ValueError(f"'output.loggers': unknown {unknown}; choose from {', '.join(LOGGERS)}")
    sub = conf.train.sub_batch_size
    if sub is not None and sub != "auto" and (isinstance(sub, str) or sub < 1):
        raise ValueError(f"'train.sub_batch_size' must be >= 1, null or auto, got {sub!r}")


def load_config(recipe: str | Path | None = None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The typed config of ``recipe`` (name or YAML path; ``None``: the default) with ``key=value`` overrides."""
    name = DEFAULT_RECIPE if recipe is None else recipe
    conf = _merge(OmegaConf.structured(ExperimentConfig), _load_raw(name), f"recipe {str(name)!r}",
                  replace_kwargs=True)
    return _finish(conf, overrides)


def apply_overrides(cfg: ExperimentConfig | dict[str, Any], overrides: Sequence[str] = ()) -> ExperimentConfig:
    """``cfg`` (a config, or a dict saved with :func:`config_to_dict`, e.g. from a checkpoint) with overrides."""
    conf = _merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(cfg if isinstance(cfg, dict) else
                                                                          config_to_dict(cfg)), "config")
    return _finish(conf, overrides)


def _finish(conf: DictConfig, overrides: Sequence[str]) -> ExperimentConfig:
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ValueError(f"overrides must look like key=value, got {bad[0]!r}")
    try:
        dotlist = OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ValueError(f"cannot parse overrides {list(overrides)}: {str(err).splitlines()[0]}") from None
    conf = _merge(conf, dotlist, "override")
    _validate(conf)
    return OmegaConf.to_object(conf)  # type: ignore[return-value]


def load_recipe(name_or_path: str | Path) -> ExperimentConfig:
    """The typed config of one recipe, without overrides."""
    return load_config(name_or_path)


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Plain nested dict of ``cfg`` (YAML/JSON/checkpoint friendly)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]


def save_config(cfg: ExperimentConfig, path: str | Path) -> Path:
    """Write the fully resolved config as YAML."""
    path = Path(path)
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return path


RECIPES: Registry[ExperimentConfig] = Registry("recipe")
"""Shipped recipes by name: ``RECIPES.build("roadmap_sop_resnet50")`` is ``load_recipe("roadmap_sop_resnet50")``."""
for _path in sorted(RECIPE_DIR.glob("*.yaml")):
    RECIPES.register(_path.stem)(partial(load_recipe, _path))
