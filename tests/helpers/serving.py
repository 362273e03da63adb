"""Asking a running service and comparing its answers with ``rankopt search``'s (the serve tests)."""

from __future__ import annotations

import json

from helpers.images import image_bytes
from rankopt.cli import main

PNG = image_bytes((200, 30, 30))
"""A small red PNG: a valid upload."""


def upload(client, data: bytes, *, name: str = "q.png", k: int | None = 5, headers=None, fields=None):
    params = {} if k is None else {"k": k}
    return client.post("/search", params=params, files={"image": (name, data, "image/png")}, data=fields,
                       headers=headers)


def cli_records(index_dir, query_files, tmp_path, k: int = 5) -> list[dict]:
    out = tmp_path / "cli.json"
    assert main(["search", str(index_dir), *map(str, query_files), "--top-k", str(k), "--json", str(out),
                 "--device", "cpu", "--no-progress"]) == 0
    return json.loads(out.read_text())


def assert_same_results(got: list[dict], expected: list[dict]) -> None:
    """Same items in the same order (rank, id, path, label, metadata, match flag) and scores within 1e-5."""
    def fields(r: dict) -> tuple:
        return r["rank"], r["id"], r["path"], r["label"], r.get("metadata"), r.get("match")

    assert [fields(r) for r in got] == [fields(r) for r in expected]
    assert all(abs(a["score"] - b["score"]) <= 1e-5 for a, b in zip(got, expected))
