"""The installed distribution matches the source tree: name, version, typing marker."""

import tomllib
from importlib.metadata import distribution
from importlib.resources import files
from pathlib import Path

import rstar2_scheduler

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_version_matches_installed_metadata() -> None:
    assert rstar2_scheduler.__version__ == distribution("rstar2-scheduler").version


def test_version_matches_pyproject() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert rstar2_scheduler.__version__ == declared


def test_ships_py_typed_marker() -> None:
    assert files("rstar2_scheduler").joinpath("py.typed").is_file()
