"""Multi-label items beyond the evaluation of stored embeddings: training with ``loss.relevance`` (the trainer's loss
gets the batch's ``Relevance.multilabel``, rows picked by the batch's dataset indices) and ``rankopt evaluate
--multilabels [--graded]`` (the metrics of ``evaluate-embeddings --multilabels`` on the same embeddings), on a tiny
generated CSV (``labels`` column) of synthetic pictures; and the combinations refused, each with its error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.config import config_to_dict, load_config
from rankopt.engine import embed_and_score
from rankopt.engine.relevance_batches import batch_labels
from rankopt.engine.trainer import Trainer
from rankopt.losses import build
from rankopt.rank import Relevance

TAGS = ("red", "blue", "round", "square", "big")


def item_tags(c: int, i: int) -> set[str]:
    """Labels that cut across the classes (so the multi-label relevance differs from the class labels)."""
    if (c, i) == (1, 3):
        return set()  # an item without labels: relevant to none
    return {TAGS[(c + i) % 2], TAGS[2 + (i // 2) % 2]} | ({"big"} if c in (0, 10) and i % 2 == 0 else set())


def write_csv(root: Path, *, labels: bool = True, flags: bool = True) -> tuple[Path, dict[str, set[str]]]:
    """4 training classes x 4 pictures, 3 validation classes x 3 (query and gallery flags: 1 vs rest, but the last
    picture of each class only in the gallery); returns the file and each image path's labels."""
    rng = np.random.default_rng(0)
    rows, tags = [], {}
    for split, classes, per_class, first in (("train", 4, 4, 0), ("validation", 3, 3, 10)):
        for c in range(first, first + classes):
            for i in range(per_class):
                name = f"img/{split}_{c}_{i}.png"
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                pixels = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8) // 2 + 40 * (c % 4)
                Image.fromarray(pixels.astype(np.uint8)).save(root / name)
                tags[str(root / name)] = item_tags(c, i)
                is_query, is_gallery = ("", "") if split == "train" else (str(i < per_class - 1), "True")
                rows.append([str(c), name, split, *((is_query, is_gallery) if flags else ()),
                             *(["|".join(sorted(item_tags(c, i)))] if labels else [])])
    header = ["label", "path", "split", *(["is_query", "is_gallery"] if flags else []), *(["labels"] if labels else [])]
    path = root / "df.csv"
    path.write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    return path, tags


def hot(paths: list[str], tags: dict[str, set[str]]) -> torch.Tensor:
    """The multi-hot rows of ``paths``, written from the table (not read back from the dataset)."""
    names = sorted(set().union(*tags.values()))
    return torch.tensor([[int(name in tags[p]) for name in names] for p in paths], dtype=torch.uint8)


def config(root: Path, csv: Path, *extra: str):
    return load_config("image_folder", [
        "data.name=csv", f"data.root={csv}", "data.image_size=16", "data.num_workers=0", "model.backbone=convnet_tiny",
        "model.embedding_dim=16", "model.freeze_bn=true", "train.sub_batch_size=null", "train.batch_size=8",
        "train.m=4", "train.epochs=1", "train.max_steps_per_epoch=2", "schedule.warmup=0", "optim.lr=0.01",
        "eval.metrics=[map@r,recall@1]", "output.progress=false", "output.figures=false", "output.tensorboard=false",
        f"output.dir={root / 'run'}", "loss.name=sup_ap", *extra])


SUM_WAP = {"relevance": "sum_wap", "weights": [0.2, 0.3, 0.5]}  # one weight per grade: G must be the same each batch


@pytest.mark.parametrize("loss, kwargs, mode, extra", [
    ("sup_ap", {}, "multilabel", ()),
    ("hap", SUM_WAP, "multilabel_graded", ("loss.kwargs.relevance=sum_wap", "loss.kwargs.weights=[0.2,0.3,0.5]")),
    ("sup_ap", {}, "multilabel", ("train.sub_batch_size=4",)),  # multistaged backprop
])
def test_training_loss_is_the_loss_of_the_batch_relevance(tmp_path, monkeypatch, loss, kwargs, mode, extra):
    """Each step's loss is the loss, built here, of that step's embeddings under the multi-label relevance of its
    images (graded: ``G`` = the most labels of a training item, 3, also in the batch without class 0, whose items
    have at most 2); the class labels would give another value."""
    csv, tags = write_csv(tmp_path)
    trainer = Trainer(config(tmp_path, csv, f"loss.name={loss}", f"loss.relevance={mode}", *extra))
    seen = []
    original = Trainer._forward_backward

    def spy(self, batch):
        value, embeddings, labels = original(self, batch)
        seen.append((list(batch["path"]), embeddings.clone(), labels.clone(), float(value.detach())))
        return value, embeddings, labels

    monkeypatch.setattr(Trainer, "_forward_backward", spy)
    trainer.train_epoch()
    assert len(seen) == 2 and [row["loss"] for row in trainer.step_log] == [v for *_, v in seen]
    loss_fn, by_class = build(loss, **kwargs), build(loss)  # sum_wap's 3 weights are for 3 grades, not 1 level
    differs = False
    for paths, embeddings, labels, value in seen:
        rows = hot(paths, tags)
        if mode == "multilabel":
            relevance = Relevance.multilabel(rows)
        else:  # the shared counts written out, G of the training set
            counts = torch.tensor([[len(tags[p] & tags[q]) for q in paths] for p in paths])
            relevance = Relevance.matrix(counts, grades=3)
        assert value == pytest.approx(float(loss_fn(embeddings, relevance)), rel=1e-5, abs=1e-6)
        differs |= abs(value - float(by_class(embeddings, labels))) > 1e-4
    assert differs


def test_training_refusals_and_batch_rows(tmp_path):
    csv, tags = write_csv(tmp_path)
    with pytest.raises(ValueError, match=r"'loss.relevance': 'multi'; choose one of none, multilabel, multilabel_"):
        config(tmp_path, csv, "loss.relevance=multi")
    with pytest.raises(ValueError, match=r"loss.relevance=multilabel: loss 'roadmap' takes class labels.*sup_ap"):
        Trainer(config(tmp_path, csv, "loss.name=roadmap", "loss.relevance=multilabel"))
    with pytest.raises(ValueError, match=r"cross-batch memory \(train.memory.enabled=true\)"):
        Trainer(config(tmp_path, csv, "loss.relevance=multilabel", "train.memory.enabled=true"))
    plain = tmp_path / "plain"
    plain.mkdir()
    no_labels, _ = write_csv(plain, labels=False)
    with pytest.raises(ValueError, match=rf"loss.relevance=multilabel_graded needs multi-label items, but the CSV file "
                                         rf"{no_labels} has no 'labels' column"):
        Trainer(config(tmp_path, no_labels, "loss.relevance=multilabel_graded"))
    cfg = config(tmp_path, csv, "loss.relevance=multilabel")
    from rankopt.data import build_dataset

    train = build_dataset("csv", csv, "train")
    labels, some = torch.zeros(3, 1, dtype=torch.long), torch.tensor([7, 0, 9])
    relevance = batch_labels(cfg, train, build("sup_ap"))(labels, some)  # the rows of dataset items 7, 0, 9
    want = hot([train.paths[i] for i in some], tags)
    assert relevance.block(slice(None)).tolist() == ((want.long() @ want.long().T) > 0).long().tolist()
    with pytest.raises(ValueError, match="trains in one process only: DDP"):
        batch_labels(cfg, train, build("sup_ap"), world_size=2)
    cfg.loss.relevance, cfg.eval.relevance = "none", "multilabel"
    validation = {"validation": build_dataset("csv", csv, "validation")}
    with pytest.raises(ValueError, match=r"eval.relevance=multilabel evaluates in one process only \(2 processes\)"):
        batch_labels(cfg, train, build("roadmap"), world_size=2, eval_ds=validation)
    assert batch_labels(cfg, train, build("roadmap"), eval_ds=validation)(labels, some) is labels
    cfg.eval.relevance = "loss"
    cfg.loss.relevance = "none"
    assert batch_labels(cfg, train, build("roadmap"), world_size=2)(labels, torch.arange(3)) is labels


def _checkpoint(tmp_path: Path) -> Path:
    from rankopt.engine.assembly import build_model
    from rankopt.engine.checkpoint import save_checkpoint

    torch.manual_seed(0)
    cfg = load_config(None, ["model.backbone=convnet_tiny", "model.embedding_dim=16"])
    return save_checkpoint(tmp_path / "model.ckpt", {"model": build_model(cfg).state_dict(),
                                                     "config": config_to_dict(cfg)})


@pytest.mark.parametrize("graded", [False, True])
def test_evaluate_multilabels_matches_evaluate_embeddings(tmp_path, capsys, graded):
    """``rankopt evaluate --multilabels`` = ``evaluate-embeddings --multilabels`` on the embeddings ``rankopt embed``
    writes: query x gallery (a query's own copy in the gallery excluded) and self-retrieval (``--split validation``);
    the class labels give other values."""
    from rankopt.cli import main
    from rankopt.data import build_dataset

    csv, tags = write_csv(tmp_path)
    common = [str(_checkpoint(tmp_path)), "--dataset", "csv", "--root", str(csv), "--image-size", "16", "--no-progress"]
    metrics = ["recall@1", "map@r", "map", "h-ap", "ndcg"]
    graded_flag = ["--graded"] if graded else []
    files = {}
    for split in ("query", "gallery", "validation"):
        files[split] = tmp_path / f"{split}.npy"
        assert main(["embed", *common, "--split", split, "--out", str(files[split])]) == 0
        np.save(tmp_path / f"{split}.hot.npy", hot(build_dataset("csv", csv, split).paths, tags).numpy())
    query, gallery = (build_dataset("csv", csv, s).paths for s in ("query", "gallery"))
    np.save(tmp_path / "own.npy", np.array([gallery.index(p) if p in gallery else -1 for p in query]))
    for split, given in ((None, ["--embeddings", str(files["gallery"]), "--multilabels",
                                 str(tmp_path / "gallery.hot.npy"), "--query-embeddings", str(files["query"]),
                                 "--query-multilabels", str(tmp_path / "query.hot.npy"),
                                 "--query-ref-index", str(tmp_path / "own.npy")]),
                         ("validation", ["--embeddings", str(files["validation"]), "--multilabels",
                                         str(tmp_path / "validation.hot.npy")])):
        split_args = [] if split is None else ["--split", split]
        out, want, labels = (tmp_path / f"{name}.json" for name in ("out", "want", "labels"))
        assert main(["evaluate", *common, *split_args, "--multilabels", *graded_flag, "--metrics", *metrics,
                     "--json", str(out)]) == 0, capsys.readouterr().err
        assert main(["evaluate-embeddings", *given, *graded_flag, "--metrics", *metrics, "--no-progress",
                     "--json", str(want)]) == 0, capsys.readouterr().err
        assert main(["evaluate", *common, *split_args, "--metrics", *metrics, "--json", str(labels)]) == 0
        result, expected = json.loads(out.read_text()), json.loads(want.read_text())
        assert result["relevance"] == ("multilabel_graded" if graded else "multilabel")
        assert result["num_queries"] == expected["num_queries"] == (6 if split is None else 9)
        assert result["num_queries_without_positive"] == expected["num_queries_without_positive"]
        assert result["metrics"] == pytest.approx(expected["metrics"], abs=1e-9)
        assert result["metrics"] != pytest.approx(json.loads(labels.read_text())["metrics"], abs=1e-6)


def test_evaluate_multilabels_refusals(tmp_path, capsys, monkeypatch):
    """Without a ``labels`` column: an error naming the file and the column before any image is embedded; --graded
    alone, --output and tar@far metrics are refused too."""
    from rankopt.cli import main

    csv, _ = write_csv(tmp_path, labels=False)
    embedded = []
    monkeypatch.setattr(embed_and_score, "embed_dataset", lambda *a, **k: embedded.append(1))
    common = [str(_checkpoint(tmp_path)), "--dataset", "csv", "--root", str(csv), "--image-size", "16", "--no-progress"]
    capsys.readouterr()
    assert main(["evaluate", *common, "--multilabels"]) == 1
    err = capsys.readouterr().err
    assert f"--multilabels needs multi-label items, but the CSV file {csv} has no 'labels' column" in err
    assert main(["evaluate", *common, "--graded"]) == 1
    assert "--graded goes with --multilabels" in capsys.readouterr().err
    assert main(["evaluate", *common, "--multilabels", "--output", str(tmp_path / "run")]) == 1
    assert "--multilabels writes --json only" in capsys.readouterr().err
    labelled = tmp_path / "labelled"
    labelled.mkdir()
    csv, _ = write_csv(labelled, flags=False)
    common[4] = str(csv)
    assert main(["evaluate", *common, "--multilabels", "--metrics", "map@r", "tar@far=1e-02"]) == 1
    assert "not with tar@far metrics" in capsys.readouterr().err
    assert embedded == []


@pytest.mark.parametrize("extra, want", [
    (("loss.relevance=multilabel",), "multilabel"),  # eval.relevance=loss: the loss's
    (("loss.relevance=multilabel_graded",), "multilabel_graded"),
    (("loss.relevance=multilabel", "eval.relevance=none"), "none"),
    (("eval.relevance=multilabel",), "multilabel"),  # a class-label loss judged by the items' labels
])
def test_evaluations_during_training_follow_eval_relevance(tmp_path, extra, want):
    """The trainer's evaluation scores the evaluation splits with the relevance ``eval.relevance`` names (by default
    the loss's): the values of ``evaluate_model(..., relevance=want)`` on the same model, which the other relevance
    does not give."""
    csv, _ = write_csv(tmp_path)
    cfg = config(tmp_path, csv, "eval.metrics=[map@r,recall@1,map,ndcg]", *extra)
    trainer = Trainer(cfg)
    got = trainer.evaluate()
    by = {mode: embed_and_score.evaluate_model(trainer.model, trainer.eval_ds, cfg.eval, show_progress=False,
                                               relevance=mode)[0].metrics
          for mode in ("none", "multilabel", "multilabel_graded")}
    assert {k: got[k] for k in by[want]} == pytest.approx(by[want], abs=1e-9)
    assert all(by[other] != pytest.approx(by[want], abs=1e-6) for other in by if other != want)


def test_multilabel_evaluation_refused_before_training(tmp_path):
    """``eval.relevance`` (given, or the loss's) multi-label on evaluation data without a ``labels`` column: refused
    when the trainer is built, before any image is embedded or the run folder made, naming the file and the column."""
    csv, _ = write_csv(tmp_path, labels=False)
    with pytest.raises(ValueError, match="'eval.relevance': 'multi'"):
        config(tmp_path, csv, "eval.relevance=multi")
    with pytest.raises(ValueError, match=rf"eval.relevance=multilabel needs multi-label items, but the CSV file {csv} "
                                         r"has no 'labels' column .*\(split 'query'\)"):
        Trainer(config(tmp_path, csv, "eval.relevance=multilabel"))
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    with_labels, _ = write_csv(tmp_path / "other")
    with pytest.raises(ValueError, match=rf"eval.relevance=loss \(loss.relevance=multilabel\) needs multi-label items, "
                                         rf"but the CSV file {csv} has no 'labels' column"):  # training items have them
        Trainer(config(tmp_path, with_labels, "loss.relevance=multilabel", f"data.eval_root={csv}",
                       "data.eval_name=csv"))
