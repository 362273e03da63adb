"""Search a gallery with a trained model: ``Index.build`` / ``search`` / ``add`` / ``remove`` / ``update`` /
``save`` / ``load``.

    from rankopt.search import Index
    index = Index.build("run/checkpoints/best.ckpt", "photos/")        # embeds every image
    result = index.search(["query.jpg"], k=10, filter="place=Paris")   # embedded by the same model
    index.save("photos.index"); Index.load("photos.index")
    with Index.editing("photos.index") as index:                       # locked, saved atomically
        index.remove(ids=["12"])

Exact search by default; ``faiss="IVF4096,PQ64"`` (any faiss factory string) for large galleries.
Queries embedded by another model or preprocessing (another fingerprint) are refused.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankopt.search.embedder import Embedder
    from rankopt.search.index import Index
    from rankopt.search.result import SearchResult

__all__ = ["Embedder", "Index", "SearchResult"]


def __getattr__(name: str) -> Any:
    """The classes imported at first use: the command line reads :mod:`rankopt.search.settings` without loading
    torch."""
    if name == "Embedder":
        from rankopt.search.embedder import Embedder

        return Embedder
    if name == "Index":
        from rankopt.search.index import Index

        return Index
    if name == "SearchResult":
        from rankopt.search.result import SearchResult

        return SearchResult
    raise AttributeError(f"module 'rankopt.search' has no attribute {name!r}")
