"""Call ``rankopt serve`` from Python with ``rankopt.client.SearchClient``.

Makes a tiny index in a temporary directory (generated pictures of 4 colours, embedded by an untrained small CNN
saved as a checkpoint: it stands in for your run's ``best.ckpt``), starts ``rankopt serve`` on it as a subprocess on
127.0.0.1, then searches by image and by item id, embeds images with the service's model, reads an item and its
thumbnail, and stops the service. Needs the ``serve`` extra: ``pip install 'rankopt[serve]'``.

Run it from the repository root: ``python examples/call_the_service.py`` (several seconds on a CPU).
"""

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from rankopt.client import NotFoundError, SearchClient, UnreachableError
from rankopt.config import config_to_dict, load_config
from rankopt.engine.assembly import build_model
from rankopt.engine.checkpoint import save_checkpoint
from rankopt.search import Index

COLOURS = {"red": (200, 40, 40), "green": (40, 180, 60), "blue": (40, 60, 200), "grey": (128, 128, 128)}

with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    for name, colour in COLOURS.items():  # photos/<class>/<i>.png
        (root / "photos" / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (48, 48), tuple(c + 15 * i for c in colour)).save(root / "photos" / name / f"{i}.png")
    torch.manual_seed(0)
    cfg = load_config(None, ["model.backbone=convnet_tiny", "model.embedding_dim=16", "data.image_size=32"])
    checkpoint = save_checkpoint(root / "model.ckpt", {"model": build_model(cfg).state_dict(),
                                                       "config": config_to_dict(cfg)})
    index = Index.build(checkpoint, root / "photos", device="cpu", progress=False)
    index.save(root / "photos.index")

    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(root / "serve.log", "w+")  # noqa: SIM115 - the server's output, shown if it stops
    server = subprocess.Popen([sys.executable, "-m", "rankopt", "serve", str(root / "photos.index"),
                               "--port", str(port), "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT)
    try:
        with SearchClient(f"http://127.0.0.1:{port}", timeout=30) as service:
            for _ in range(600):  # wait until it answers
                try:
                    health = service.health()
                    break
                except UnreachableError:
                    assert server.poll() is None, f"rankopt serve stopped:\n{log.seek(0) or log.read()}"
                    time.sleep(0.1)
            else:
                raise AssertionError("rankopt serve did not answer within a minute")
            print(f"serving {health['items']} items, fingerprint {health['fingerprint']}")

            query = root / "photos" / "blue" / "1.png"
            hits = service.search(query, k=3)["results"]
            print("by image:", [(h["id"], h["label"], round(h["score"], 3)) for h in hits])
            expected = index.search([query], k=3).records()[0]["results"]
            assert [h["id"] for h in hits] == [e["id"] for e in expected] and hits[0]["label"] == "blue"

            similar = service.search(id=hits[0]["id"], k=3)["results"]  # "more like this"
            print("by id:   ", [(h["id"], h["label"]) for h in similar])
            embedded = service.embed([query, root / "photos" / "red" / "0.png"])
            assert embedded.fingerprint == index.fingerprint and embedded.embeddings.shape == (2, 16)
            print("item:", service.item(hits[0]["id"])["path"])
            assert service.thumbnail(hits[0]["id"])[:2] == b"\xff\xd8"  # a JPEG
            try:
                service.item("no-such-id")
            except NotFoundError as err:
                print(f"error {err.status}: {err.message}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
