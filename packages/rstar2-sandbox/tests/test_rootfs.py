"""What goes into a fork-server's root (``executor/rootfs.py``), judged without building one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rstar2_sandbox.executor.rootfs import (
    account_files,
    elf_interpreter,
    plan_root,
    python_paths,
    under,
)


def test_the_interpreters_loader_is_found() -> None:
    loader = elf_interpreter(os.path.realpath(sys.executable))
    if loader is None:
        pytest.skip("a statically linked interpreter names no loader")
    assert os.path.isabs(loader)
    assert os.path.exists(loader)


def test_a_file_that_is_not_elf_names_no_loader(tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    assert elf_interpreter(str(script)) is None


def test_project_directories_on_sys_path_stay_out_but_a_preloaded_package_comes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    package = project / "src" / "toolpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.syspath_prepend(str(project / "src"))
    paths = python_paths([])
    assert not [p for p in paths if under(os.path.realpath(p), [str(tmp_path)])]
    assert sys.executable in paths
    monkeypatch.delitem(sys.modules, "toolpkg", raising=False)
    __import__("toolpkg")
    assert str(package) in python_paths(["toolpkg"])


def test_the_plan_holds_existing_paths_and_the_slot_users() -> None:
    plan = plan_root([], [70001, 70002])
    assert all(os.path.lexists(path) for path in plan.read_only)
    assert not any(path in ("/", "/home", "/root", os.getcwd()) for path in plan.read_only)
    assert "sandbox:x:70002:70002:sandbox:/tmp/run-70002:" in plan.files["/etc/passwd"]
    assert account_files([5])["/etc/group"].endswith("sandbox:x:5:\n")
