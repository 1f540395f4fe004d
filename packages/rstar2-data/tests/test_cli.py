"""The rstar2-data command line: build, stats, recipes, and clear errors."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_data.cli import app
from rstar2_data.terminal import cut_words

runner = CliRunner()


def test_help_documents_every_option() -> None:
    result = runner.invoke(app, ["build", "--help"])
    assert result.exit_code == 0
    for option in ("--out", "--var", "--seed", "--progress", "--verbose"):
        assert option in result.output


@pytest.mark.parametrize("command", [[], ["build"], ["stats"], ["recipes"]])
def test_help_fits_80_columns_without_cutting_a_word(command: list[str]) -> None:
    narrow = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}).output
    wide = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "1000"}).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)


def test_recipes_table_fits_80_columns_without_cutting_a_word() -> None:
    narrow = runner.invoke(app, ["recipes"], env={"COLUMNS": "80"}).output
    wide = runner.invoke(app, ["recipes"], env={"COLUMNS": "1000"}).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)


def test_recipes_lists_the_shipped_ones() -> None:
    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0, result.output
    for name in ("demo", "demo-sft", "sft-nonreasoning", "rl-math", "rl-hard"):
        assert name in result.output


def test_build_then_stats(tmp_path: Path) -> None:
    recipe = tmp_path / "small.yaml"
    recipe.write_text(
        "name: small\nkind: math\nsources:\n"
        "  - {name: demo, synthetic: demo, demo: {n: 30, levels: [1]}}\n"
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", str(recipe), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "wrote 30 rows" in result.output
    first = (out / "data.jsonl").read_bytes()
    result = runner.invoke(app, ["build", str(recipe), "--out", str(out), "--seed", "9"])
    assert result.exit_code == 0, result.output
    assert (out / "data.jsonl").read_bytes() != first
    result = runner.invoke(app, ["stats", str(out)])
    assert result.exit_code == 0, result.output
    assert "integer: 30" in result.output


def test_errors_exit_nonzero_with_a_message(tmp_path: Path) -> None:
    result = runner.invoke(app, ["build", "rl-hard", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "${PROBLEMS} is not set" in result.output
    result = runner.invoke(app, ["build", "demo", "--out", str(tmp_path), "--var", "oops"])
    assert result.exit_code != 0
    assert "NAME=VALUE" in result.output
    result = runner.invoke(app, ["stats", str(tmp_path / "nothing")])
    assert result.exit_code == 2
    assert "no manifest.json" in result.output
