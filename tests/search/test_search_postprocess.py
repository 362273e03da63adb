"""The landmark toolbox inside an index: multi-scale and whitening join the embedding pipeline and the
fingerprint (and are applied to image queries), DBA rewrites the indexed vectors, αQE expands queries."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from rankopt.cli import main
from rankopt.metrics.topk import chunked_topk
from rankopt.postprocess import (
    Expansion,
    PostProcessing,
    alpha_query_expansion,
    database_augmentation,
    fit_pca_whitening,
)
from rankopt.search import Embedder, Index

from helpers.checkpoints import write_checkpoint
from helpers.images import draw

SCALES = (1.0, 0.5)


def _whitening(embedder: Embedder, tree: Path, scales: tuple[float, ...] | None = SCALES):
    """A PCA whitening fitted on the multi-scale embeddings of ``tree`` for ``embedder``'s model."""
    plain = embedder.with_postprocessing(PostProcessing(scales=scales)).embed(tree).embeddings
    fitted = fit_pca_whitening(plain.double(), dim=8, fitted_on="test tree")
    return dataclasses.replace(fitted, model_fingerprint=embedder.fingerprint, scales=scales)


def test_multiscale_and_whitening_are_part_of_the_index(tree: Path, queries: Path, checkpoint: Path, tmp_path: Path):
    embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False)
    post = PostProcessing(scales=SCALES, whitening=_whitening(embedder, tree))
    index = Index.build(embedder, tree, postprocessing=post, progress=False)
    assert index.dim == 8 and index.fingerprint != embedder.fingerprint
    assert index.preprocessing["multiscale"] == [1.0, 0.5] and index.preprocessing["whitening"]["kind"] == "pca"

    # the indexed vectors are the whitened multi-scale embeddings, computed by hand
    ms = embedder.with_postprocessing(PostProcessing(scales=SCALES)).embed(tree)
    assert torch.allclose(index.embeddings, post.whitening.apply(ms.embeddings), atol=1e-6)

    # save -> load: the whitening travels in the folder; image queries go through the same pipeline
    index.save(tmp_path / "idx")
    assert (tmp_path / "idx" / "v000001" / "whitening.safetensors").is_file()
    loaded = Index.load(tmp_path / "idx")
    result = loaded.search(queries, 5, checkpoint=checkpoint)
    q = post.whitening.apply(embedder.with_postprocessing(PostProcessing(scales=SCALES)).embed(queries).embeddings)
    scores, ids = chunked_topk(q, index.embeddings, 5)
    assert torch.equal(result.rows, ids) and torch.allclose(result.scores, scores, atol=1e-6)

    # embeddings made without the pipeline are refused by fingerprint
    with pytest.raises(ValueError, match="fingerprint"):
        loaded.search(embedder.embed(queries).embeddings[:, :8], 3, fingerprint=embedder.fingerprint)
    # an embedder with other scales is refused, naming what differs
    other = embedder.with_postprocessing(PostProcessing(scales=(1.0,)))
    with pytest.raises(ValueError, match="multiscale"):
        loaded.search(queries, 3, model=other)
    # a whitening file replaced by another one is caught when loading
    swapped = dataclasses.replace(post.whitening, mean=post.whitening.mean + 1)
    from rankopt.postprocess import save_whitening

    save_whitening(swapped, tmp_path / "idx" / "v000001" / "whitening.safetensors")
    with pytest.raises(ValueError, match="not the whitening index.json names"):
        Index.load(tmp_path / "idx")
    (tmp_path / "idx" / "v000001" / "whitening.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="whitening.safetensors is missing"):
        Index.load(tmp_path / "idx")


def test_a_whitening_fitted_for_another_model_is_refused(tree: Path, checkpoint: Path, tmp_path: Path):


    embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False)
    other = Embedder.from_checkpoint(write_checkpoint(tmp_path / "other.ckpt", seed=1), device="cpu", progress=False)
    with pytest.raises(ValueError, match="fitted for model fingerprint"):
        Index.build(other, tree, postprocessing=PostProcessing(scales=SCALES, whitening=_whitening(embedder, tree)),
                    progress=False)


def test_dba_rewrites_the_indexed_vectors_and_qe_expands_queries(tree: Path, queries: Path, checkpoint: Path,
                                                                  tmp_path: Path):
    embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False)
    raw = embedder.embed(tree).embeddings
    dba, qe = Expansion(k=2, alpha=3.0), Expansion(k=3, alpha=2.0)
    index = Index.build(embedder, tree, postprocessing=PostProcessing(dba=dba), progress=False)
    assert torch.allclose(index.embeddings, database_augmentation(raw, dba), atol=1e-6)
    assert index.fingerprint == embedder.fingerprint  # DBA does not change how a query is embedded
    q = embedder.embed(queries).embeddings
    expanded = alpha_query_expansion(q, index.embeddings, qe)
    assert not torch.allclose(expanded, q)
    result = index.search(q, 4, qe=qe)
    scores, ids = chunked_topk(expanded, index.embeddings, 4)
    assert torch.equal(result.rows, ids) and torch.allclose(result.scores, scores, atol=1e-6)
    index.save(tmp_path / "idx")
    assert Index.load(tmp_path / "idx").info["dba"] == {"k": 2, "alpha": 3.0}

    # an αQE given when building is stored and applied by every search (rankopt fit chooses one), Expansion(0): none
    stored = Index.build(embedder, tree, postprocessing=PostProcessing(dba=dba, qe=qe), progress=False)
    stored.save(tmp_path / "idx-qe")
    loaded = Index.load(tmp_path / "idx-qe")
    assert loaded.query_expansion == qe and loaded.info["qe"] == {"k": 3, "alpha": 2.0}
    assert torch.equal(loaded.search(q, 4).rows, result.rows)
    plain = loaded.search(q, 4, qe=Expansion(0))
    assert torch.equal(plain.rows, chunked_topk(q, index.embeddings, 4)[1])


def _by_path(index: Index) -> dict[str, torch.Tensor]:
    return {Path(p).name + Path(p).parent.name: v for p, v in zip(index.paths, index.embeddings)}


def _same_vectors(index: Index, fresh: Index) -> None:
    changed, built = _by_path(index), _by_path(fresh)
    assert changed.keys() == built.keys()
    for key, vector in built.items():
        assert torch.allclose(changed[key], vector, atol=1e-6), key


def test_a_dba_index_changes_as_a_fresh_build_of_its_items_would(tree: Path, checkpoint: Path, tmp_path: Path):
    """Adding, removing and re-embedding items of a DBA index gives every item the vector that building the index
    anew over the same images gives it (old items gain and lose neighbours); the model's own vectors are saved."""
    embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False)
    post = PostProcessing(dba=Expansion(k=2, alpha=3.0))
    files = sorted(tree.rglob("*.png"))
    first, rest = files[: len(files) // 2], files[len(files) // 2 :]
    index = Index.build(embedder, first, postprocessing=post, progress=False)
    before = index.embeddings.clone()
    index.add(rest)
    _same_vectors(index, Index.build(embedder, files, postprocessing=post, progress=False))
    assert not torch.allclose(index.embeddings[: len(first)], before)  # old items took new neighbours
    index.save(tmp_path / "idx")
    loaded = Index.load(tmp_path / "idx")
    assert torch.equal(loaded.unaugmented, index.unaugmented) and torch.equal(loaded.embeddings, index.embeddings)
    loaded.remove(paths=[str(rest[0]), str(first[1])])
    kept = [f for f in files if f not in (rest[0], first[1])]
    _same_vectors(loaded, Index.build(embedder, kept, postprocessing=post, progress=False))
    # a changed file is re-embedded and every neighbour recomputed
    draw(first[0], (250, 250, 250), 7)
    assert loaded.update()["changed"] == [loaded.ids[0]]
    _same_vectors(loaded, Index.build(embedder, kept, postprocessing=post, progress=False))
    # without the vectors before augmentation (a folder written before they were kept) no change is possible
    loaded.unaugmented = None
    with pytest.raises(ValueError, match="does not hold the vectors before augmentation, so items cannot be removed"):
        loaded.remove(ids=[loaded.ids[0]])


def test_cli_whiten_index_search_with_every_step(tree: Path, queries: Path, tmp_path: Path, capsys):


    ckpt = write_checkpoint(tmp_path / "m.ckpt", ["data.name=image_folder", f"data.root={tree}"])
    whitening = tmp_path / "w.safetensors"
    assert main(["whiten", str(ckpt), "--dataset", "image_folder", "--root", str(tree), "--split", "all",
                 "--dim", "8", "--multiscale", "1", "0.5", "--out", str(whitening), "--no-progress"]) == 0
    out = tmp_path / "idx"
    assert main(["index", str(ckpt), "--images", str(tree), "--out", str(out), "--whiten", str(whitening),
                 "--multiscale", "1", "0.5", "--dba", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "multi-scale 1, 0.5" in printed and "pca whitening" in printed and "DBA k=2" in printed
    info = json.loads((out / "index.json").read_text())
    assert info["dim"] == 8 and info["dba"] == {"k": 2, "alpha": 2.0}
    records = tmp_path / "r.json"
    assert main(["search", str(out), str(queries), "--top-k", "3", "--qe", "2", "--json", str(records),
                 "--no-progress"]) == 0
    assert [len(r["results"]) for r in json.loads(records.read_text())] == [3, 3, 3]
    # the whitening was fitted with multi-scale embeddings: indexing without --multiscale is refused
    assert main(["index", str(ckpt), "--images", str(tree), "--out", str(tmp_path / "bad"),
                 "--whiten", str(whitening), "--no-progress"]) == 1
    assert "use the same --multiscale" in capsys.readouterr().err
    assert main(["search", str(out), str(queries), "--qe-alpha", "3", "--no-progress"]) == 1
    assert "--qe-alpha needs --qe K" in capsys.readouterr().err


def test_embed_writes_the_fingerprint_an_index_of_its_vectors_needs(tree: Path, queries: Path, checkpoint: Path,
                                                                    tmp_path: Path):
    import numpy as np

    out = tmp_path / "E.npy"
    assert main(["embed", str(checkpoint), "--images", str(tree), "--out", str(out), "--no-progress"]) == 0
    info = json.loads((tmp_path / "E.json").read_text())
    assert info["fingerprint"] == Embedder.from_checkpoint(checkpoint, device="cpu", progress=False).fingerprint
    paths = (tmp_path / "E.paths.txt").read_text().splitlines()
    index = Index.from_embeddings(np.load(out), paths=paths, fingerprint=info["fingerprint"], progress=False)
    result = index.search(queries, 3, checkpoint=checkpoint)  # image queries pass the fingerprint check
    assert result.rows.shape == (3, 3) and result.paths[0][0] in paths
    # another image size makes other embeddings: another fingerprint, refused by the index
    assert main(["embed", str(checkpoint), "--images", str(tree), "--image-size", "48", "--out",
                 str(tmp_path / "F.npy"), "--no-progress"]) == 0
    other = json.loads((tmp_path / "F.json").read_text())
    assert other["fingerprint"] != info["fingerprint"] and other["preprocessing"]["image_size"] == 48
    with pytest.raises(ValueError, match="fingerprint"):
        index.search(np.load(tmp_path / "F.npy"), 3, fingerprint=other["fingerprint"])


def test_cli_refuses_a_user_folder_as_index_before_embedding_and_names_a_non_image(tree: Path, checkpoint: Path,
                                                                                    tmp_path: Path, capsys,
                                                                                    monkeypatch):
    import rankopt.search.embedder as embedder_module

    def must_not_embed(*args, **kwargs):
        raise AssertionError("embedding started before the output folder was checked")

    monkeypatch.setattr(embedder_module, "embed_dataset", must_not_embed)
    before = sorted(p.name for p in tree.rglob("*"))
    assert main(["index", str(checkpoint), "--images", str(tree), "--out", str(tree), "--no-progress"]) == 1
    assert "not a rankopt index: refusing to replace it" in capsys.readouterr().err
    assert sorted(p.name for p in tree.rglob("*")) == before
    monkeypatch.undo()

    assert main(["index", str(checkpoint), "--images", str(tree), "--out", str(tmp_path / "idx"), "--no-progress"]) == 0
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), str(text), "--no-progress"]) == 1
    assert "notes.png" in (err := capsys.readouterr().err) and "not an image file Pillow can read" in err
