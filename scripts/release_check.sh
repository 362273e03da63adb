#!/usr/bin/env bash
# Check a release as a user will meet it (docs/release.md):
#   1. build the sdist and the wheel into dist/ and run `twine check --strict` on them;
#   2. create a new virtual environment in a temporary folder outside the repository, install
#      torch==2.13.0 first (as scripts/bootstrap.sh does) and then the wheel with the `serve` extra;
#   3. from that folder, run `rankopt --version` (must print the wheel's version), `rankopt datasets`,
#      the README's main job `rankopt train` (must end with metrics and a run folder with report.html)
#      and `rankopt serve --help`.
# Exits non-zero at the first failure.
#   bash scripts/release_check.sh              # build, check, install, run (a few minutes)
#   bash scripts/release_check.sh --no-build   # check the sdist and wheel already in dist/
# Environment: PYTHON (default python3), TORCH_INDEX_URL (install torch from that index instead of
# torch==2.13.0, as bootstrap.sh), KEEP=1 (keep the temporary folder).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
build=1
case "${1:-}" in
    "") ;;
    --no-build) build=0 ;;
    *) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/rankopt-release.XXXXXX")"
case "$work/" in
    "$repo"/*) echo "release_check: the temporary folder $work lies inside the repository" >&2; exit 1 ;;
esac
cleanup() {
    if [ -n "${KEEP:-}" ]; then echo "release_check: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
unset PYTHONPATH  # the installed wheel, not the source tree, must answer
step() { printf '\n== %s (%ds)\n' "$*" "$SECONDS"; }

# -------------------------------------------------------------- build and check, with throwaway tools
step "tools: build, twine (a venv in $work/tools)"
"$PY" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q --upgrade pip
"$work/tools/bin/python" -m pip install -q build twine "readme_renderer[md]"
if [ "$build" = 1 ]; then
    step "build the sdist and the wheel into dist/"
    rm -f "$repo"/dist/rankopt-*.tar.gz "$repo"/dist/rankopt-*.whl
    "$work/tools/bin/python" -m build --outdir "$repo/dist" "$repo"
fi
shopt -s nullglob
wheels=("$repo"/dist/rankopt-*.whl)
sdists=("$repo"/dist/rankopt-*.tar.gz)
shopt -u nullglob
if [ "${#wheels[@]}" -ne 1 ] || [ "${#sdists[@]}" -ne 1 ]; then
    echo "release_check: expected one wheel and one sdist in dist/, found ${#wheels[@]} and ${#sdists[@]}" >&2
    exit 1
fi
wheel="${wheels[0]}"
version="$(basename "$wheel" | cut -d- -f2)"
step "twine check --strict ($(basename "${sdists[0]}"), $(basename "$wheel"))"
"$work/tools/bin/python" -m twine check --strict "${sdists[0]}" "$wheel"

# -------------------------------------------------------------- a new environment, away from the repository
cd "$work"
step "a new venv in $work/venv: torch first, then the wheel with [serve]"
"$PY" -m venv venv
venv/bin/python -m pip install -q --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    venv/bin/python -m pip install -q torch --index-url "$TORCH_INDEX_URL"
else
    venv/bin/python -m pip install -q "torch==2.13.0"
fi
venv/bin/python -m pip install -q "${wheel}[serve]"
where="$(venv/bin/python -c 'import rankopt, sys; sys.stdout.write(rankopt.__file__)')"
case "$where" in
    "$work"/venv/*) echo "rankopt imported from $where" ;;
    *) echo "release_check: rankopt was imported from $where, not from the new venv" >&2; exit 1 ;;
esac

export RANKOPT_CACHE="$work/cache"  # the synthetic data are generated afresh, as on a new machine
step "rankopt --version"
printed="$(venv/bin/rankopt --version)"
echo "$printed"
if [ "$printed" != "rankopt $version" ]; then
    echo "release_check: 'rankopt --version' printed '$printed', the wheel is $version" >&2
    exit 1
fi
step "rankopt datasets"
venv/bin/rankopt datasets
step "rankopt train (the main job) --output $work/run"
venv/bin/rankopt train --output "$work/run" 2>&1 | tee "$work/train.log"
for f in report.html metrics.json config.yaml checkpoints/last.ckpt; do
    if [ ! -s "$work/run/$f" ]; then
        echo "release_check: the run folder has no $f" >&2
        exit 1
    fi
done
if ! grep -q "final report (" "$work/train.log" || ! grep -qi "map@r" "$work/train.log" \
        || ! grep -q "^report: .*report.html" "$work/train.log"; then
    echo "release_check: the main job did not end with its metrics and report.html" >&2
    exit 1
fi
step "rankopt serve --help"
venv/bin/rankopt serve --help
step "release_check: rankopt $version passed"
