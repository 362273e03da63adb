"""A search index from Python: build from your own embeddings, search, add, remove, save, load, search again.

``rankopt.search.Index.from_embeddings`` indexes vectors you already have (``fingerprint`` names the model that made
them; queries of another fingerprint are refused); ``Index.build(checkpoint, "photos/")`` would embed a folder of
images instead. Items get stable string ids; metadata columns can filter a search.

Run it from the repository root: ``python examples/index_from_python.py`` (a second or two on a CPU).
"""

import tempfile

import torch

from rankopt.search import Index

torch.manual_seed(0)
centres = torch.randn(5, 32)
labels = torch.arange(5).repeat_interleave(20)  # 5 classes x 20 items
vectors = centres[labels] + 0.3 * torch.randn(100, 32)
shops = ["north" if i % 2 else "south" for i in range(100)]

index = Index.from_embeddings(vectors, labels=labels, fingerprint="my-model-v1", metadata={"shop": shops})
print(index)

query = centres[2:3] + 0.3 * torch.randn(1, 32)  # a new point near class 2
top = index.search(query, k=5).records()[0]["results"]
print("top 5:", [(r["id"], r["label"], round(r["score"], 3)) for r in top])
assert [r["label"] for r in top] == [2] * 5

north = index.search(query, k=5, filter={"shop": "north"}).records()[0]["results"]
assert all(r["metadata"]["shop"] == "north" for r in north) and len(north) == 5

# add two items (new ids "100", "101"), then remove the best hit: ids never move, removed ids are never reused
added = index.add(centres[2:3].repeat(2, 1), labels=torch.tensor([2, 2]), metadata={"shop": ["east", "east"]})
assert added is index and index.ids[-2:] == ["100", "101"] and len(index) == 102
best = index.search(query, k=1).records()[0]["results"][0]
assert best["id"] in ("100", "101")  # the class centre itself beats every noisy item
assert index.remove(ids=[best["id"]]) == [best["id"]] and len(index) == 101
print(f"added 2, removed {best['id']}: {len(index)} items")

with tempfile.TemporaryDirectory() as tmp:
    index.save(f"{tmp}/shop.index")
    loaded = Index.load(f"{tmp}/shop.index")
    again = loaded.search(query, k=5).records()[0]["results"]
    before = index.search(query, k=5).records()[0]["results"]
    print("after save/load:", [(r["id"], round(r["score"], 3)) for r in again])
    assert [r["id"] for r in again] == [r["id"] for r in before] and best["id"] not in [r["id"] for r in again]
    assert all(abs(a["score"] - b["score"]) < 1e-6 for a, b in zip(again, before))
    assert loaded.item("101" if best["id"] == "100" else "100")["metadata"] == {"shop": "east"}
    try:  # vectors of another model are refused
        loaded.search(query, k=1, fingerprint="another-model")
    except ValueError as err:
        print("refused:", err)
    else:
        raise AssertionError("a query of another fingerprint was searched")
