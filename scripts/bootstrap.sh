#!/usr/bin/env bash
# Create ./.venv and install rankopt into it.
#   bash scripts/bootstrap.sh          # the library and its command line
#   bash scripts/bootstrap.sh test     # plus the test dependencies
# On a machine without CUDA the CPU build of torch is installed first, so that
# the package's normal `torch>=2.1` requirement is already satisfied and pip does
# not pull the multi-GB CUDA wheels. Set TORCH_INDEX_URL to install torch from a
# specific package index (for example a CPU-only index).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        .venv/bin/python -m pip install -q torch --index-url "$TORCH_INDEX_URL"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        .venv/bin/python -m pip install -q "torch>=2.1"
    else
        .venv/bin/python -m pip install -q "torch==2.13.0"
    fi
fi
if [ -n "$extras" ]; then
    .venv/bin/python -m pip install -q -e ".[$extras]"
else
    .venv/bin/python -m pip install -q -e .
fi
# An editable install leaves the project's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set (as in
# many containers) Python never writes their bytecode: every command would compile them again (0.18 s of each
# start, measured on `rankopt index`). Compiled once here; a module edited later is recompiled as usual.
.venv/bin/python -m compileall -q src/rankopt
