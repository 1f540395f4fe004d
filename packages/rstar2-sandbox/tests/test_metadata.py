"""The installed distribution matches the source tree: name, version, typing marker."""

import tomllib
from importlib.metadata import distribution
from importlib.resources import files
from pathlib import Path

import rstar2_sandbox

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_version_matches_installed_metadata() -> None:
    assert rstar2_sandbox.__version__ == distribution("rstar2-sandbox").version


def test_version_matches_pyproject() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert rstar2_sandbox.__version__ == declared


def test_ships_py_typed_marker() -> None:
    assert files("rstar2_sandbox").joinpath("py.typed").is_file()
