"""Typed configs, recipe inheritance and key=value overrides (rankopt.config)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rankopt.config import (
    ExperimentConfig,
    apply_overrides,
    config_to_dict,
    list_recipes,
    load_config,
    load_recipe,
    save_config,
)


def test_default_recipe_is_typed_and_overridable():
    cfg = load_config(None, ["train.epochs=3", "optim.lr=0.5", "train.grad_clip=1.5", "eval.metrics=[map@r]"])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.name == "default" and cfg.data.name == "synthetic"
    assert (cfg.train.epochs, cfg.optim.lr, cfg.train.grad_clip, cfg.eval.metrics) == (3, 0.5, 1.5, ["map@r"])
    assert isinstance(cfg.optim.lr, float) and isinstance(cfg.train.epochs, int)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["train.epochz=3"], "unknown config key 'train.epochz'"),
        (["nosection.x=1"], "unknown config key 'nosection"),
        (["train.epochs=three"], "invalid value for 'train.epochs'"),
        (["train.memory.enabled=maybe"], "invalid value for 'train.memory.enabled'"),
        (["train.amp=fp8"], "'train.amp'"),
        (["optim.name=lamb"], "'optim.name'"),
        (["train.batch_size=0"], "'train.batch_size' must be >= 1"),
        (["train.epochs"], "key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        load_config(None, override)


def test_unknown_recipe_lists_known_ones():
    with pytest.raises(KeyError, match="unknown recipe 'nope'.*default"):
        load_config("nope")


def test_recipe_file_with_unknown_key_and_wrong_type(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epoch: 3\n")
    with pytest.raises(ValueError, match="unknown config key 'train.epoch'"):
        load_config(bad)
    bad.write_text("train:\n  batch_size: [1, 2]\n")
    with pytest.raises(ValueError, match="train.batch_size"):
        load_config(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_base_inheritance_replaces_free_form_kwargs(tmp_path: Path):
    parent = tmp_path / "parent.yaml"
    parent.write_text("loss: {name: roadmap, kwargs: {lam: 0.3, tau: 0.02}}\ntrain: {epochs: 7, sampler_kwargs: {a: 1}}\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {parent}\ntrain: {{batch_size: 32, sampler_kwargs: {{b: 2}}}}\n")
    cfg = load_config(child)
    assert cfg.train.epochs == 7 and cfg.train.batch_size == 32
    assert cfg.train.sampler_kwargs == {"b": 2}  # replaced, not merged
    assert cfg.loss.kwargs == {"lam": 0.3, "tau": 0.02}
    other = tmp_path / "other.yaml"
    other.write_text(f"base: {parent}\nloss: {{name: sup_ap}}\n")
    assert load_config(other).loss.kwargs == {}  # a new loss does not inherit the old loss's kwargs
    # an override of one kwarg merges; an override of the loss name drops the old kwargs
    assert load_config(parent, ["loss.kwargs.tau=0.05"]).loss.kwargs == {"lam": 0.3, "tau": 0.05}
    assert load_config(parent, ["loss.name=smooth_ap"]).loss.kwargs == {}
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"base: {loop}\n")
    with pytest.raises(ValueError, match="circular"):
        load_config(loop)


def test_round_trip_through_dict_and_yaml(tmp_path: Path):
    cfg = load_config("default", ["train.epochs=2", "model.embedding_dim=64"])
    again = apply_overrides(config_to_dict(cfg))
    assert again == cfg
    path = save_config(cfg, tmp_path / "config.yaml")
    assert load_config(path) == cfg
    assert yaml.safe_load(path.read_text())["train"]["epochs"] == 2
    assert apply_overrides(cfg, ["train.seed=5"]).train.seed == 5


def test_every_recipe_loads_and_cites_a_source():
    names = list_recipes()
    assert "default" in names and len(names) >= 15
    for name in names:
        cfg = load_recipe(name)
        assert cfg.name == name, f"recipe {name} declares name {cfg.name}"
        assert cfg.description
        from rankopt.config import RECIPE_DIR

        text = (RECIPE_DIR / f"{name}.yaml").read_text()
        assert text.startswith("#"), f"recipe {name} must start with a comment citing its source"


def test_a_new_sampler_drops_the_recipe_sampler_kwargs():
    from rankopt.config import load_config

    assert load_config("omniglot").train.sampler_kwargs  # the recipe's hierarchical sampler settings
    assert load_config("omniglot", ["train.sampler=m_per_class"]).train.sampler_kwargs == {}
    cfg = load_config("omniglot", ["train.sampler=m_per_class", "train.sampler_kwargs.small_class_policy=drop"])
    assert cfg.train.sampler_kwargs == {"small_class_policy": "drop"}
    kept = load_config("omniglot", ["train.sampler=hierarchical"]).train.sampler_kwargs
    assert kept["super_classes_per_batch"] == 4
