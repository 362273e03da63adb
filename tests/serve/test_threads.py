"""``--threads N``: torch's intra-op threads of ``rankopt serve`` (its settings, its torch thread) and of the commands
that embed (``index``, ``embed``, ``evaluate``, ``search``, ``index-add``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from rankopt.cli import build_parser, main
from rankopt.search import Embedder
from rankopt.serve.batcher import default_threads
from rankopt.serve.torch_thread import TORCH_THREAD

COMMANDS = ("serve", "index", "embed", "evaluate", "whiten", "search", "calibrate", "index-add", "index-update")


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """torch's threads of the calling thread set to 2 inside, restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_bad_thread_counts_are_refused(command: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--threads", value])
    assert exit_.value.code == 2
    assert f"argument --threads: expected a number of threads >= 1, got '{value}'" in capsys.readouterr().err


def test_serve_gives_the_threads_to_its_settings(served: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr("rankopt.serve.server.serve", lambda index, settings, **kwargs: seen.append(settings.threads))
    assert main(["serve", str(served / "idx"), "--threads", "3"]) == 0
    assert main(["serve", str(served / "idx")]) == 0
    assert seen == [3, None]


@pytest.mark.parametrize("threads", [1, 2, None])
def test_the_service_runs_torch_on_its_threads(make_client: Callable, threads: int | None) -> None:
    client = make_client(threads=threads)
    assert client.get("/health").status_code == 200
    assert TORCH_THREAD.run(torch.get_num_threads) == (threads or default_threads())


def test_embed_embeds_on_the_threads_asked_for(served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               torch_threads: None) -> None:
    from rankopt.engine import embed_and_score as evaluation

    seen, embed_dataset = [], evaluation.embed_dataset

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return embed_dataset(*args, **kwargs)

    monkeypatch.setattr(evaluation, "embed_dataset", spy)
    argv = ["embed", str(served / "model.ckpt"), "--images", str(served / "gallery"), "--device", "cpu",
            "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "a.npy"), "--threads", "1"]) == 0
    torch.set_num_threads(2)
    assert main([*argv, "--out", str(tmp_path / "b.npy")]) == 0  # without --threads: torch's threads as they were
    assert seen == [1, 2]


@pytest.mark.parametrize("command", ["index", "search"])
def test_index_and_search_embed_on_the_threads_asked_for(command: str, served: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, torch_threads: None) -> None:
    seen, embed = [], Embedder.embed

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return embed(self, *args, **kwargs)

    monkeypatch.setattr(Embedder, "embed", spy)
    if command == "index":
        argv = ["index", str(served / "model.ckpt"), "--images", str(served / "gallery"),
                "--out", str(tmp_path / "idx")]
    else:
        argv = ["search", str(served / "idx"), str(served / "queries"), "--top-k", "2"]
    assert main([*argv, "--device", "cpu", "--no-progress", "--threads", "1"]) == 0
    assert seen and set(seen) == {1}
