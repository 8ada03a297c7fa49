#!/usr/bin/env bash
# Download, HERE (with PyPI), the wheels that the GPU machine (no network) lacks, into benchmarks/gpu/wheels/
# (git-ignored), for benchmarks/gpu/run.sh to install with `pip --no-index`:
#
#   bash benchmarks/gpu/fetch_wheels.sh                 # Python 3.11 and 3.12, skipping the image's packages
#   bash benchmarks/gpu/fetch_wheels.sh --python 3.12   # one version (repeat the flag for more)
#   bash benchmarks/gpu/fetch_wheels.sh --with pyarrow   # fetch a package of the image list too (another version)
#   bash benchmarks/gpu/fetch_wheels.sh --all           # assume only torch, transformers, accelerate, triton, numpy
#
# What is fetched: the package's own requirements (pyproject.toml) and pytest, resolved for the target Python on
# manylinux x86_64, minus what the GPU machine has: torch, transformers, accelerate, triton, numpy (and CUDA's
# wheels) always, and unless --all the packages of its image listed in benchmarks/gpu/image_packages.txt.
# kornia and kornia-rs are fetched without their requirements (kornia's pull torch). Per version the pinned list goes to
# wheels/requirements-X.Y.txt; run.sh installs exactly that list, --no-deps. The folder travels with the work tree
# to the GPU machine (carry benchmarks/gpu/wheels), where at most 64 MiB travels in all: --all does not fit
# (pyarrow and pandas alone are ~65 MB for one Python version), so it is for machines without that limit.
set -euo pipefail

PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WHEELS=$ROOT/benchmarks/gpu/wheels
VERSIONS=()
ALL=0
WITH=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --python)
        [[ $# -ge 2 && $2 =~ ^3\.[0-9]+$ ]] || {
            echo "fetch_wheels.sh: --python needs a version like 3.12; got '${2:-}'" >&2
            exit 2
        }
        VERSIONS+=("$2")
        shift 2
        ;;
    --with)
        [[ $# -ge 2 && -n $2 && $2 != --* ]] || {
            echo "fetch_wheels.sh: --with needs a package name of image_packages.txt; got '${2:-}'" >&2
            exit 2
        }
        WITH+=("$2")
        shift 2
        ;;
    --all) ALL=1 && shift ;;
    *)
        echo "fetch_wheels.sh: unknown argument '$1'; expected --python X.Y, --with NAME (both repeatable) or --all" >&2
        exit 2
        ;;
    esac
done
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=(3.11 3.12)
TARGET=(--only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux1_x86_64)
mkdir -p "$WHEELS"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The roots: the package's requirements except the ones the GPU machine has and kornia (its requirement goes to
# kornia.txt, fetched --no-deps: its requirements pull torch), plus the test runner. Python 3.10 has no tomllib:
# tomli, or else the copy pip vendors (this script needs pip anyway), so that no package has to be installed first.
"$PYTHON" - "$ROOT/pyproject.toml" "$WORK/kornia.txt" >"$WORK/roots.txt" <<'PY'
import re, sys
try:
    import tomllib
except ModuleNotFoundError:
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        from pip._vendor import tomli as tomllib
requirements = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
skip = {"torch", "transformers", "accelerate", "triton", "numpy", "kornia"}
for requirement in requirements + ["pytest>=8"]:
    name = re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].lower()
    if name == "kornia":
        open(sys.argv[2], "w").write(requirement + "\n")
    elif name not in skip:
        print(requirement)
PY
[[ $ALL == 1 ]] && printf '%s\n' "setuptools>=68" wheel >>"$WORK/roots.txt" # for `pip install -e .` there

for version in "${VERSIONS[@]}"; do
    echo "== Python $version: resolving $(paste -sd' ' "$WORK/roots.txt")"
    # --target: pip before 24 refuses --platform without it (nothing is installed: --dry-run)
    "$PYTHON" -m pip install -q --dry-run --ignore-installed --target "$WORK/unused" \
        --report "$WORK/report-$version.json" \
        --python-version "$version" "${TARGET[@]}" -r "$WORK/roots.txt"
    "$PYTHON" -m pip install -q --dry-run --ignore-installed --no-deps --target "$WORK/unused" \
        --report "$WORK/kornia-$version.json" \
        --python-version "$version" "${TARGET[@]}" -r "$WORK/kornia.txt" "kornia-rs>=0.2"
    # pinned name==version of every resolved distribution the GPU machine lacks
    "$PYTHON" - "$WORK/report-$version.json" "$WORK/kornia-$version.json" "$ALL" \
        "$ROOT/benchmarks/gpu/image_packages.txt" "${WITH[@]}" >"$WORK/pins-$version.txt" <<'PY'
import json, re, sys
canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
always = {"torch", "transformers", "accelerate", "triton", "numpy"}
skip = set(always)
if sys.argv[3] != "1":
    skip |= {canon(l.split("#")[0].strip()) for l in open(sys.argv[4]) if l.split("#")[0].strip()}
skip -= {canon(name) for name in sys.argv[5:]}  # --with: wanted although the image has a version
for report in sys.argv[1:3]:
    for item in json.load(open(report))["install"]:
        name = canon(item["metadata"]["name"])
        if name in skip or name.startswith(("nvidia-", "cuda-")):
            continue
        print(f"{name}=={item['metadata']['version']}")
PY
    "$PYTHON" -m pip download -q --no-deps --dest "$WHEELS" --python-version "$version" "${TARGET[@]}" \
        -r "$WORK/pins-$version.txt"
    cp "$WORK/pins-$version.txt" "$WHEELS/requirements-$version.txt"
    echo "   $(wc -l <"$WORK/pins-$version.txt") wheels: $(paste -sd' ' "$WORK/pins-$version.txt")"
done
size=$(du -sm "$WHEELS" | cut -f1)
echo "$WHEELS: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, ${size} MiB"
if [[ $size -gt 60 ]]; then
    echo "warning: over 60 MiB; the GPU tool carries at most 64 MiB with the work tree (fetch fewer versions)" >&2
fi
