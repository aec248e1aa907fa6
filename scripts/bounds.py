"""The dependency bounds, read from pyproject.toml, for the `make test-next` lane.

    python scripts/bounds.py uncapped test plot     # the requirements with every upper bound dropped
    python scripts/bounds.py beyond test plot        # installed releases past pyproject's upper bounds
    python scripts/bounds.py capped test plot        # the caps, if any (exit 1 when there are none)

`uncapped` prints one requirement a line, the floors kept and the caps dropped, so pip installs the newest
release of each. `beyond` reads what is installed and names each package whose release the declared range
refuses, with the cap's reason (the comment beside it): the packages to suspect when the lane fails.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def declared(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras:
        found += project["optional-dependencies"][extra]
    return [Requirement(r) for r in found]


def floors_only(req: Requirement) -> str:
    """The requirement with its floor kept and every cap dropped (a pin, == or ~=, becomes its floor)."""
    kept = [
        f">={s.version}" if s.operator in ("==", "~=") else str(s)
        for s in req.specifier
        if s.operator in (">=", ">", "==", "~=")
    ]
    return f"{req.name}{SpecifierSet(','.join(kept))}"


def cap_reasons() -> dict[str, str]:
    """Each capped dependency's comment on its own line in pyproject.toml: why it is capped."""
    reasons = {}
    for line in PYPROJECT.read_text().splitlines():
        m = re.match(r'\s*"([A-Za-z0-9_.\-]+)[^"]*<[^"]*",?\s*(?:#\s*(.*))?$', line)
        if m:
            reasons[m.group(1).lower()] = m.group(2) or "no reason given beside the cap"
    return reasons


def beyond(extras: list[str]) -> list[str]:
    reasons, out = cap_reasons(), []
    for req in declared(extras):
        try:
            have = version(req.name)
        except PackageNotFoundError:
            continue
        if not req.specifier.contains(have, prereleases=True):
            why = reasons.get(req.name.lower(), "")
            out.append(f"{req.name} {have} (pyproject.toml declares {req.specifier}{'; ' + why if why else ''})")
    return out


if __name__ == "__main__":
    what, extras = sys.argv[1], sys.argv[2:]
    if what == "uncapped":
        print("\n".join(floors_only(r) for r in declared(extras)))
    elif what == "capped":
        caps = [str(r) for r in declared(extras) if any(s.operator in ("<", "<=", "~=", "==") for s in r.specifier)]
        print("capped: " + ("; ".join(caps) if caps else "nothing (the newest releases are test-next's)"))
        sys.exit(0 if caps else 1)
    elif what == "beyond":
        past = beyond(extras)
        print("releases beyond pyproject.toml's ranges: " + ("; ".join(past) if past else "none"))
    else:
        sys.exit(f"usage: {sys.argv[0]} uncapped|capped|beyond [EXTRA ...]")
