"""Bad input to every rstar2-data command: exit code 2, one line naming the file or option at
fault, no traceback, and no wait on the network."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_data.cli import app

# Offline: a hub source must fail at once, in one line, instead of retrying the network.
runner = CliRunner(env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "80"})

HUB_RECIPE = """\
name: from-hub
kind: math
sources:
  - name: dapo
    hub: open-r1/no-such-dataset-for-rstar2-tests
    converter: dapo_processed
"""


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error" in line.lower()]


def assert_one_line_error(arguments: list[str], message: str) -> None:
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = error_lines(result.output)
    assert message in line
    # One line, option validation included (not click's Usage/Try/Error block).
    assert [text for text in result.output.splitlines() if text.strip()] == [line]
    assert line.startswith("error: ")


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "broken.yaml").write_text("name: broken\nsources: [\n")
    (tmp_path / "typo.yaml").write_text("name: typo\nkind: math\nsorces: []\n")
    (tmp_path / "hub.yaml").write_text(HUB_RECIPE)
    bad_build = tmp_path / "bad-build"
    bad_build.mkdir()
    (bad_build / "manifest.json").write_text('{"rows": "many"}')
    return tmp_path


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["build", "{tmp}/no-such.yaml", "--out", "{tmp}/out"], "no-such.yaml"),
        (["build", "{tmp}/broken.yaml", "--out", "{tmp}/out"], "broken.yaml: invalid YAML: line 3"),
        (["build", "{tmp}/typo.yaml", "--out", "{tmp}/out"], "sorces"),
        (["build", "demo", "--out", "{tmp}/a-file/out"], "a-file is not a directory"),
        (
            ["build", "{tmp}/hub.yaml", "--out", "{tmp}/out"],
            "could not reach dataset open-r1/no-such-dataset-for-rstar2-tests",
        ),
        (["stats", "{tmp}/nothing"], "no manifest.json"),
        (["build", "demo"], "Missing option '--out' / '-o'. (see root build --help)"),
        (["stats", "{tmp}/bad-build"], "manifest.json: not a valid manifest"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    arguments: list[str], message: str, inputs: Path
) -> None:
    assert_one_line_error([a.format(tmp=inputs) for a in arguments], message)


def test_unreachable_hub_names_the_local_alternative(inputs: Path) -> None:
    result = runner.invoke(app, ["build", str(inputs / "hub.yaml"), "--out", str(inputs / "o")])
    assert "HF_HUB_OFFLINE is set" in result.output
    assert "local `path:`" in result.output
