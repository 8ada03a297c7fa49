"""Prints the dependency floors of pyproject.toml as pins, one requirement a line, for `make test-floors`.

Every runtime dependency ([project].dependencies) becomes `name==<its >= bound>`, so that pip installs the oldest
release the package declares it works with. A runtime dependency without a `>=` bound is an error: its floor could
not be checked. `--with NAME` adds the floor of an optional dependency (the test tools of the `dev` extra), and
`--only NAME` prints the pin of that one runtime dependency (torch, installed first from its own index).

    python .ci/floors.py                       # the runtime floors
    python .ci/floors.py --only torch          # torch==<floor>
    python .ci/floors.py --with pytest --with peft
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: tomllib is 3.11's
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# name[extras] specifiers ; marker  (PEP 508, without URLs, which a floor cannot come from)
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def floor_pin(requirement: str) -> tuple[str, str]:
    """(canonical name, `name[extras]==floor ; marker`) of one requirement string; SystemExit without a `>=`."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        sys.exit(f"floors: cannot parse the requirement {requirement!r} in {PYPROJECT}")
    name, extras, specifiers, marker = match.groups()
    floors = [spec[2:].strip() for spec in specifiers.split(",") if spec.strip().startswith(">=")]
    if len(floors) != 1:
        sys.exit(
            f"floors: {requirement!r} in {PYPROJECT} needs exactly one '>=' bound to be checked at its floor"
        )
    pin = f"{name}{extras or ''}=={floors[0]}"
    return canonical(name), f"{pin} {marker}" if marker else pin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="NAME", help="print the pin of this one runtime dependency")
    parser.add_argument(
        "--with",
        dest="optional",
        metavar="NAME",
        action="append",
        default=[],
        help="add the floor of this optional dependency (any extra); repeatable",
    )
    args = parser.parse_args()

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    runtime = dict(floor_pin(requirement) for requirement in project["dependencies"])
    if args.only is not None:
        if canonical(args.only) not in runtime:
            sys.exit(f"floors: {args.only!r} is not a runtime dependency in {PYPROJECT}")
        print(runtime[canonical(args.only)])
        return

    optional: dict[str, str] = {}
    for requirements in project.get("optional-dependencies", {}).values():
        for requirement in requirements:
            name = REQUIREMENT.match(requirement)
            if name is not None and canonical(name.group(1)) in map(canonical, args.optional):
                optional.setdefault(*floor_pin(requirement))
    missing = sorted(set(map(canonical, args.optional)) - optional.keys() - runtime.keys())
    if missing:
        sys.exit(f"floors: {', '.join(missing)}: no such optional dependency in {PYPROJECT}")
    print("\n".join([*runtime.values(), *(optional[name] for name in optional if name not in runtime)]))


if __name__ == "__main__":
    main()
