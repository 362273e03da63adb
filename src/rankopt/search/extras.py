"""The optional packages of the search backends and file formats, imported on first use with a hint to install them."""

from __future__ import annotations

import importlib
from typing import Any


def import_optional(module: str, hint: str) -> Any:
    """``module`` imported, or an ``ImportError`` with ``hint`` (what needs it and how to install it)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # depends on the environment
        raise ImportError(hint) from err


def import_faiss() -> Any:
    return import_optional("faiss", "faiss indexes need faiss: pip install faiss-cpu (or faiss-gpu)")


def import_qdrant() -> Any:
    return import_optional("qdrant_client", "the qdrant backend needs qdrant-client: pip install 'rankopt[qdrant]' "
                                            "(or pip install qdrant-client)")


def import_pyarrow() -> Any:
    import_optional("pyarrow.parquet", "Parquet files need pyarrow: pip install 'rankopt[parquet]' (or pip install "
                                       "pyarrow)")
    return importlib.import_module("pyarrow")  # its parquet submodule loaded above
