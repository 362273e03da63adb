#!/usr/bin/env bash
# Build the documentation site (mkdocs-material + mkdocstrings) into site/, strict: a broken link, a missing
# reference or any warning fails the build.
#   bash scripts/docs.sh           # build into site/ (ignored by git); open site/index.html
#   bash scripts/docs.sh serve     # preview at http://127.0.0.1:8000/, rebuilt on every change
# Needs the docs extra: pip install -e '.[docs]' (or: bash scripts/bootstrap.sh docs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if ! "$PY" -c "import mkdocs, material, mkdocstrings_handlers.python, mathjax" 2>/dev/null; then
    echo "scripts/docs.sh: the docs extra is missing: $PY -m pip install -e '.[docs]'" >&2
    exit 1
fi
export NO_MKDOCS_2_WARNING=1
case "${1:-build}" in
    build) shift || true; exec "$PY" -m mkdocs build --strict --site-dir site "$@" ;;
    serve) shift; exec "$PY" -m mkdocs serve --strict "$@" ;;
    *) echo "usage: bash scripts/docs.sh [build|serve] [mkdocs options]" >&2; exit 2 ;;
esac
