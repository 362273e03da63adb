"""Issue 29: commands check their metrics and outputs before embedding anything; ``auto`` settings resolved for the
machine (workers, training sub-batches); CPU forwards in chunks that stay in the kept memory (same embeddings and
metrics as whole batches); plain progress lines when no terminal shows a bar."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers.checkpoints import write_checkpoint
from helpers.images import photo_tree
from torch import nn

from rankopt import runtime
from rankopt.cli import main
from rankopt.config import EvalConfig, load_config
from rankopt.data import build_dataset
from rankopt.data.transforms import build_transform
from rankopt.engine import embed_and_score, trainer
from rankopt.engine.assembly import build_model
from rankopt.console import progress

TINY = ["model.backbone=convnet_tiny", "model.embedding_dim=16", "data.image_size=16"]


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "model.ckpt", TINY)


@pytest.fixture
def embed_calls(monkeypatch) -> list[str]:
    """Every embedding pass the engine starts (the spy records the split's description and stops it)."""
    calls: list[str] = []

    def spy(*args, desc: str = "", **kwargs):
        calls.append(desc)
        raise AssertionError(f"{desc}: embedded before the checks")

    monkeypatch.setattr(embed_and_score, "embed_dataset", spy)
    monkeypatch.setattr(trainer, "embed_dataset", spy)
    return calls


# ----------------------------------------------------------------------------- checks before embedding
def test_evaluate_refuses_a_missing_label_level_before_embedding(checkpoint, tmp_path, embed_calls, capsys):
    photos = photo_tree(tmp_path / "photos")
    start = time.perf_counter()
    code = main(["evaluate", str(checkpoint), "--dataset", "image_folder", "--root", str(photos),
                 "--metrics", "map", "ap@level1", "--no-progress"])
    assert time.perf_counter() - start < 1.0
    assert code == 1 and embed_calls == []
    err = capsys.readouterr().err
    assert "'ap@level1'" in err and "1 level(s)" in err and "use ap@level0" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--metrics", "recal@1"], "--metrics: unknown metric 'recal@1'"),
    (["--metrics", "tar@far=2"], "--metrics: metric 'tar@far=2'"),
    (["--json", "{tmp}"], "--json {tmp}: is a folder"),
    (["--json", "{checkpoint}"], "would overwrite an input"),
    (["--output", "{checkpoint}"], "is a file; give a folder"),
    (["--json", "{checkpoint}/x.json"], "is a file, not a folder"),
])
def test_evaluate_checks_names_and_outputs_before_embedding(checkpoint, tmp_path, embed_calls, capsys, argv,
                                                           message):
    photos = photo_tree(tmp_path / "photos")
    argv = [a.format(tmp=tmp_path, checkpoint=checkpoint) for a in argv]
    assert main(["evaluate", str(checkpoint), "--dataset", "image_folder", "--root", str(photos), *argv,
                 "--no-progress"]) == 1
    assert embed_calls == []
    assert message.format(tmp=tmp_path, checkpoint=checkpoint) in capsys.readouterr().err


@pytest.mark.parametrize("command", [["embed", "--out", "{file}/e.npy"], ["whiten", "--out", "{file}/w.safetensors"]])
def test_embed_and_whiten_check_their_output_before_embedding(checkpoint, tmp_path, embed_calls, capsys, command):
    photos = photo_tree(tmp_path / "photos")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    name, *rest = command
    argv = [name, str(checkpoint), "--dataset", "image_folder", "--root", str(photos), "--split", "test",
            *[a.format(file=blocker) for a in rest], "--no-progress"]
    assert main(argv) == 1
    assert embed_calls == [] and f"{blocker} is a file, not a folder" in capsys.readouterr().err


def test_train_refuses_eval_metrics_the_eval_data_lacks_before_reading_an_image(tmp_path, embed_calls, capsys):
    photos = photo_tree(tmp_path / "photos")
    run = tmp_path / "run"
    assert main(["train", "image_folder", f"data.root={photos}", *TINY, "eval.metrics=[map,ap@level2]",
                 "train.best_metric=map", "--output", str(run)]) == 1
    assert embed_calls == [] and not run.exists()
    assert "eval.metrics: metric 'ap@level2'" in capsys.readouterr().err


def test_check_metrics_parses_and_counts_levels():
    from rankopt.metrics import check_metrics

    assert [s.name for s in check_metrics(["Recall@4", "tar@far=1e-03", "ap@level1"], 2)] == ["recall@4", "ap@level1"]
    with pytest.raises(ValueError, match=r"eval.metrics: metric 'ap@level2' needs label column 2.*ap@level0 .. "
                                         r"ap@level1"):
        check_metrics(["ap@level2"], 2, source="eval.metrics")
    with pytest.raises(ValueError, match="recall@0"):
        check_metrics(["recall@0"])


# ----------------------------------------------------------------------------- forward chunks: same results
def test_activation_bytes_counts_saved_tensors_per_image():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    model.train()
    before = model[1].running_mean.clone()
    saved, largest = runtime.activation_bytes(model, torch.randn(2, 3, 8, 8))
    # per image: the conv's input (3 x 8 x 8), the batch norm's input and the ReLU's output (4 x 8 x 8 each), float32
    assert (saved, largest) == (4 * (3 + 4 + 4) * 64, 4 * 4 * 64)
    assert model.training and torch.equal(model[1].running_mean, before)
    assert runtime.activation_bytes(model, torch.randn(6, 3, 8, 8)[:2]) == (saved, largest)  # a slice: its own bytes


def test_chunked_embedding_gives_the_whole_batch_metrics(monkeypatch, tmp_path):
    torch.manual_seed(0)
    model = build_model(load_config(None, TINY)).eval()
    dataset = build_dataset("image_folder", photo_tree(tmp_path / "photos", 6, 4), "all",
                            transform=build_transform("test", 16))
    cfg = EvalConfig(metrics=["recall@1", "map", "map@r"], batch_size=24)
    whole, [whole_split] = embed_and_score.evaluate_model(model, {"all": dataset}, cfg, show_progress=False)
    sample = torch.stack([dataset[i]["image"] for i in range(24)])
    assert runtime.forward_chunk(model, sample) == 24  # a tiny model: one forward per batch
    _, largest = runtime.activation_bytes(model, sample[:1])
    monkeypatch.setattr(runtime, "KEEP_BYTES", largest * runtime.CHUNK_SHARE * 5)
    assert runtime.forward_chunk(model, sample) == 5
    sizes = []
    model.register_forward_pre_hook(lambda module, inputs: sizes.append(len(inputs[0])))
    chunked, [chunked_split] = embed_and_score.evaluate_model(model, {"all": dataset}, cfg, show_progress=False)
    assert sizes[-5:] == [5, 5, 5, 5, 4]
    torch.testing.assert_close(chunked_split.embeddings, whole_split.embeddings, rtol=0, atol=1e-6)
    assert chunked.metrics == whole.metrics



def test_reading_ahead_on_cpu_reads_batches_of_at_most_cpu_batch_photos_with_the_same_embeddings(tmp_path):
    """A 256-photo batch read ahead only held more decoded photos alive (the forward runs in chunks anyway): on CPU
    the readers' batches are :data:`rankopt.data.reader.CPU_BATCH` photos at most, the embeddings unchanged."""
    from rankopt.data.reader import CPU_BATCH

    torch.manual_seed(0)
    model = build_model(load_config(None, TINY)).eval()
    dataset = build_dataset("image_folder", photo_tree(tmp_path / "photos", 10, 8), "all",
                            transform=build_transform("test", 16))
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda module, inputs: sizes.append(len(inputs[0])))
    kw = {"batch_size": 256, "show_progress": False}
    read_here = embed_and_score.embed_dataset(model, dataset, **kw)
    assert sizes == [1, 80]  # the forward's chunk sized on one photo; read in the calling thread: the batch asked for
    sizes.clear()
    read_ahead = embed_and_score.embed_dataset(model, dataset, read_threads=2, **kw)
    assert sizes == [1, CPU_BATCH, CPU_BATCH, 80 - 2 * CPU_BATCH]
    torch.testing.assert_close(read_ahead.embeddings, read_here.embeddings, rtol=0, atol=1e-6)

# ----------------------------------------------------------------------------- auto settings
def test_sub_batch_size_fits_memory_and_kept_allocations():
    cpu = torch.device("cpu")
    budget = runtime.memory_bytes(cpu)
    assert runtime.sub_batch_size(budget // 10, 1, 60, cpu) == 10
    assert runtime.sub_batch_size(budget // 10, 1, 64, cpu) == 10  # 7 even sub-batches of at most 10 (10 x 6 + 4)
    assert runtime.sub_batch_size(budget // 10, 1, 8, cpu) is None
    kept = runtime.KEEP_BYTES // runtime.CHUNK_SHARE
    assert runtime.sub_batch_size(1, kept // 41, 128, cpu) == 32  # not 41, 41, 41, 5
    assert runtime.sub_batch_size(budget * 2, 1, 64, cpu) == 1
    cases = ((256, 85), (256, 27), (24, 5), (24, 100), (7, 0))
    assert [runtime.even_chunk(batch, fit) for batch, fit in cases] == [64, 26, 5, 24, 1]
    assert runtime.workers(cpu) == 0


@pytest.mark.parametrize(("overrides", "workers", "sub"), [
    (["data.num_workers=auto", "train.sub_batch_size=auto"], 0, 3),
    (["data.num_workers=0", "train.sub_batch_size=4"], 0, 4),
])
def test_train_resolves_auto_values_prints_and_saves_them(tmp_path, monkeypatch, capsys, overrides, workers, sub):
    photos = photo_tree(tmp_path / "photos", 8, 4)
    measured = []
    real = runtime.activation_bytes

    def measure(model, sample):
        measured.append(real(model, sample))
        return measured[-1]

    monkeypatch.setattr(runtime, "activation_bytes", measure)
    monkeypatch.setattr(runtime, "memory_bytes", lambda device: 3 * measured[-1][0])  # three images fill it
    run = tmp_path / "run"
    assert main(["train", "image_folder", f"data.root={photos}", *TINY, *overrides, "train.batch_size=8",
                 "train.epochs=1", "train.max_steps_per_epoch=1", "schedule.warmup=0", "output.tensorboard=false",
                 "output.figures=false", "--output", str(run)]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["data"]["num_workers"], saved["train"]["sub_batch_size"]) == (workers, sub)
    out = capsys.readouterr().out
    assert ("auto settings for cpu" in out) == ("auto" in " ".join(overrides))
    if "auto" in " ".join(overrides):
        assert "data.num_workers=0" in out and "train.sub_batch_size=3" in out and "per image at (3, 16, 16)" in out


@pytest.mark.parametrize(("override", "message"), [
    ("data.num_workers=some", "'data.num_workers' must be >= 0 or auto"),
    ("train.sub_batch_size=big", "'train.sub_batch_size' must be >= 1, null or auto"),
])
def test_bad_auto_values_are_refused(override, message):
    with pytest.raises(ValueError, match=message):
        load_config("image_folder", [override])


def test_image_folder_recipe_fits_the_machine():
    cfg = load_config("image_folder")
    assert (cfg.data.num_workers, cfg.train.sub_batch_size) == ("auto", "auto")


# ----------------------------------------------------------------------------- progress without a terminal
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_prints_plain_lines_without_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())  # no terminal: no bar
    out = io.StringIO()
    assert list(progress(range(4), desc="embedding test", count=lambda i: 2, every=0.0, stream=out)) == [0, 1, 2, 3]
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[-1].endswith("(done)")
    assert lines[1].startswith("embedding test: step 2/4, ") and "images/s, ETA " in lines[1]
    quiet = io.StringIO()
    assert list(progress(range(4), desc="x", stream=quiet)) == [0, 1, 2, 3]  # under 10 s: no line
    assert quiet.getvalue() == ""


def test_progress_keeps_the_live_bar_on_a_terminal(monkeypatch):
    from tqdm.auto import tqdm

    monkeypatch.setattr("sys.stderr", Terminal())
    out = io.StringIO()
    bar = progress(range(3), desc="epoch 1/1", every=0.0, stream=out)
    assert isinstance(bar, tqdm) and list(bar) == [0, 1, 2] and out.getvalue() == ""


def test_embedding_logs_progress_lines_to_a_captured_stream(monkeypatch, capsys, tmp_path):
    from rankopt import console

    monkeypatch.setattr(console, "PROGRESS_EVERY", 0.0)
    torch.manual_seed(0)
    model = build_model(load_config(None, TINY))
    dataset = build_dataset("image_folder", photo_tree(tmp_path / "photos"), "all",
                            transform=build_transform("test", 16))
    split = embed_and_score.embed_dataset(model, dataset, batch_size=5, desc="embedding all")
    assert split.embeddings.shape == (12, 16)
    lines = capsys.readouterr().err.splitlines()  # captured: not a terminal
    assert [line.split(",")[0] for line in lines] == ["embedding all: step 1/3", "embedding all: step 2/3",
                                                     "embedding all: step 3/3", "embedding all: step 3/3"]
    assert all(" images/s, ETA " in line for line in lines) and lines[-1].endswith("(done)")
