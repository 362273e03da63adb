"""``rankopt serve`` as a real process on a free loopback port, queried over HTTP."""

from __future__ import annotations

import httpx

from helpers.serving import assert_same_results, cli_records


def test_the_real_server_answers_over_http(live_server, served, query_files, tmp_path, capsys):
    health = httpx.get(f"{live_server}/health", timeout=10).json()
    assert health["status"] == "ok" and health["items"] == 12
    expected = cli_records(served / "idx", query_files, tmp_path, k=4)
    capsys.readouterr()
    with httpx.Client(base_url=live_server, timeout=30) as client:
        answered_before = searches_answered(client)  # the server is shared with the page test
        for path, record in zip(query_files, expected):
            answer = client.post("/search", params={"k": 4}, files={"image": (path.name, path.read_bytes())})
            assert answer.status_code == 200, answer.text
            assert_same_results(answer.json()["results"], record["results"])
        bad = client.post("/search", files={"image": ("x.png", b"nope")})
        assert bad.status_code == 400 and "not an image" in bad.json()["error"]
        item_id = expected[0]["results"][0]["id"]
        assert client.get(f"/thumbnails/{item_id}").headers["content-type"] == "image/jpeg"
        assert client.get("/thumbnails/../../etc/passwd").status_code == 404
        metrics = client.get("/metrics").text
        assert searches_answered(client) == answered_before + 3
        assert "rankopt_serve_index_items 12" in metrics
        page = client.get("/")
        assert page.status_code == 200 and "rankopt search" in page.text


def searches_answered(client: httpx.Client) -> int:
    """The server's count of ``POST /search`` answered with 200 (``GET /metrics``)."""
    sample = 'rankopt_serve_requests_total{route="/search",method="POST",code="200"} '
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith(sample)]
    return int(lines[0].removeprefix(sample)) if lines else 0
