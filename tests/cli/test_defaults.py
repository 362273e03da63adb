"""The command line's defaults come from the settings dataclasses (one source), read without importing torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from rankopt.cli import build_parser
from rankopt.fit import FitSettings
from rankopt.search import Embedder, Index
from rankopt.search.settings import EMBED, INDEX
from rankopt.serve.limits import Limits
from rankopt.serve.settings import Settings


def _defaults(command: str, *positional: str) -> dict:
    parser = build_parser()
    return vars(parser.parse_args([command, *positional]))


def test_index_and_search_defaults_are_the_settings():
    index = _defaults("index", "model.ckpt", "--images", "PHOTOS", "--out", "INDEX")
    assert (index["batch_size"], index["num_workers"], index["device"]) == \
        (EMBED.batch_size, EMBED.num_workers, EMBED.device)
    assert (index["similarity"], index["backend"]) == (INDEX.similarity, INDEX.backend)
    search = _defaults("search", "INDEX", "query.jpg")
    assert (search["batch_size"], search["device"]) == (EMBED.batch_size, EMBED.device)


def test_the_api_defaults_are_the_same_settings():
    embedder = {f.name: f.default for f in dataclasses.fields(Embedder)}
    assert (embedder["batch_size"], embedder["num_workers"]) == (EMBED.batch_size, EMBED.num_workers)
    build = Index.build.__func__.__kwdefaults__  # type: ignore[attr-defined]
    assert (build["batch_size"], build["device"], build["similarity"]) == \
        (EMBED.batch_size, EMBED.device, INDEX.similarity)


def test_fit_and_serve_defaults_are_their_settings():
    fit = _defaults("fit", "PHOTOS", "--out", "RUN")
    settings = FitSettings()
    assert (fit["minutes"], fit["backbone"], fit["queries"], fit["seed"]) == \
        (settings.minutes, settings.backbone, settings.queries, settings.seed)
    serve = _defaults("serve", "INDEX")
    assert serve["port"] == Settings().port and serve["max_k"] == Limits().max_k


def test_reading_the_defaults_does_not_import_torch():
    code = ("import sys; from rankopt.cli import build_parser; build_parser(); "
            "loaded = [m for m in ('torch', 'numpy', 'PIL') if m in sys.modules]; print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "torch" not in out, out
