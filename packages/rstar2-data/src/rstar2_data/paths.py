"""Output paths checked before any work starts, so a long job never fails at its last write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import typer

OptionalPath = TypeVar("OptionalPath", Path, Path | None)


def _nearest_existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def output_dir_problem(directory: Path) -> str | None:
    """Why files cannot be written under ``directory`` (created later if missing), or ``None``.

    Nothing is created: the nearest existing ancestor must be a directory this process may
    write into.
    """
    existing = _nearest_existing(directory)
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def output_file_problem(file: Path) -> str | None:
    """Why ``file`` cannot be written (its folder created later if missing), or ``None``."""
    if file.is_dir():
        return f"{file} is a directory"
    return output_dir_problem(file.parent)


def checked_output_dir(value: OptionalPath) -> OptionalPath:
    """A typer option callback: the usage error (exit code 2) of ``output_dir_problem``."""
    problem = None if value is None else output_dir_problem(value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value


def checked_output_file(value: OptionalPath) -> OptionalPath:
    """A typer option callback: the usage error (exit code 2) of ``output_file_problem``."""
    problem = None if value is None else output_file_problem(value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value
