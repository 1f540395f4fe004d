"""docs/architecture.md stays true to the code: the dependency order its packages declare, and
the modules it names exist. (rstar2-train's tests run with every rstar2 package installed.)"""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "architecture.md"

pytestmark = pytest.mark.skipif(not DOC.is_file(), reason="needs the monorepo checkout")


def _declared(package: str) -> set[str]:
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    specs = project["project"]["dependencies"]
    return {name for name in (re.split(r"[^a-z0-9-]", s, maxsplit=1)[0] for s in specs)
            if name.startswith("rstar2-")}  # fmt: skip


def test_the_dependency_order_is_the_one_the_packages_declare() -> None:
    block = DOC.read_text().split("```")[1]  # the first code block: the dependency order
    entries: dict[str, str] = {}  # package -> what it depends on (continuation lines joined)
    for line in block.splitlines():
        if line.startswith("rstar2-"):
            package, rest = line.split(maxsplit=1)
            entries[package] = rest
        elif line.strip() and entries:
            entries[package] += " " + line.strip()
    assert list(entries) == [
        "rstar2-sandbox", "rstar2-algo", "rstar2-data", "rstar2-scheduler", "rstar2-eval",
        "rstar2-train",
    ]  # fmt: skip
    above: list[str] = []
    for package, text in entries.items():
        stated = (
            set(above) if "all of the above" in text else set(re.findall(r"rstar2-[a-z]+", text))
        )
        assert stated == _declared(package), package
        assert stated <= set(above), f"{package} depends on a package below it"
        above.append(package)


def test_every_module_it_names_exists() -> None:
    named = set(re.findall(r"`(rstar2_[a-z]+(?:\.[a-z_]+)*)`", DOC.read_text()))
    assert {"rstar2_data.protocol", "rstar2_scheduler.protocol", "rstar2_data.tools"} <= named
    for module in sorted(named):
        importlib.import_module(module)


def test_the_readme_links_it_and_nothing_outside_the_project() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/architecture.md)" in readme
    assert "../shared/DESIGN.md" not in readme
