"""A source that cannot be read stops the build with exit code 2 and one line naming the file,
the line (or Parquet row group) and what was expected, and leaves nothing behind; an empty
source is warned about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_data.cli import app
from rstar2_data.jsonl import DataFileError, iter_jsonl_lines

runner = CliRunner(env={"COLUMNS": "80"})
GOOD = json.dumps({"problem": "What is 6 times 7?", "answer": 42}) + "\n"


def recipe(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"name: r\nkind: math\nsources: [{{name: s, path: {source}, fields: {{}}}}]\n")
    return path


def fails_in_one_line(tmp_path: Path, source: str, *options: str) -> str:
    """The one error line of a build of ``source``, which must leave no output folder."""
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["build", str(recipe(tmp_path, source)), "--out", str(out), "--no-progress", *options]
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error: ")
    assert not out.exists()
    return line


def test_invalid_utf8_names_the_line_and_byte(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_bytes(GOOD.encode() + b'{"problem": "caf\xe9?", "answer": 1}\n')
    line = fails_in_one_line(tmp_path, "p.jsonl")
    assert f"{tmp_path / 'p.jsonl'}:2: invalid UTF-8 at byte 17 of the line" in line
    assert "expected UTF-8 text" in line


def test_json_errors_keep_their_column(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(GOOD + '{"problem": "a\x01b", "answer": 1}\n')
    line = fails_in_one_line(tmp_path, "p.jsonl")
    assert "p.jsonl:2: invalid JSON: Invalid control character at column 15" in line
    (tmp_path / "p.jsonl").write_text(GOOD * 2 + '{"problem": , "answer": 1}\n')
    line = fails_in_one_line(tmp_path, "p.jsonl")
    assert "p.jsonl:3: invalid JSON: Expecting value at column 13" in line
    assert "expected one JSON object per line" in line


def test_a_csv_source_is_refused_when_the_recipe_is_read(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text("problem,answer\nWhat is 6 times 7?,42\n")
    line = fails_in_one_line(tmp_path, "p.csv")
    assert "sources.0.path" in line
    assert "expected a .jsonl, .json or .parquet file, got p.csv" in line


def write_parquet(path: Path, groups: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"problem": f"Problem number {i} " * 20, "answer": i} for i in range(300 * groups)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=300)


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    (tmp_path / "p.parquet").write_text(GOOD)
    line = fails_in_one_line(tmp_path, "p.parquet")
    assert f"{tmp_path / 'p.parquet'}: expected a Parquet file, but pyarrow cannot read" in line


def test_a_corrupt_row_group_is_named(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    write_parquet(path, groups=3)
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = column.dictionary_page_offset or column.data_page_offset
    middle = start + column.total_compressed_size // 2
    data[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    line = fails_in_one_line(tmp_path, "p.parquet")
    assert f"{path}: row group 2 of 3 (rows 301-600) cannot be read: " in line
    assert "expected valid Parquet data" in line


def test_a_line_over_the_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    # Not JSON past its first MiB: parsed, it would fail as invalid JSON instead.
    long = '{"problem": "' + "x" * (1 << 20) + "\n"
    (tmp_path / "p.jsonl").write_text(GOOD + long)
    line = fails_in_one_line(tmp_path, "p.jsonl", "--max-line-mib", "1")
    assert "p.jsonl:2: line longer than 1,048,576 bytes" in line
    # The default limit is 16 MiB.
    (tmp_path / "p.jsonl").write_text(GOOD + long.replace("\n", '", "answer": 1}\n'))
    result = runner.invoke(
        app, ["build", str(recipe(tmp_path, "p.jsonl")), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output


def test_the_line_limit_counts_bytes_without_the_newline(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"a": 1}\n{"a": 22}')  # 8 and 9 bytes
    assert [row for _, row in iter_jsonl_lines(path, max_line_bytes=9)] == [{"a": 1}, {"a": 22}]
    with pytest.raises(DataFileError, match=r"p\.jsonl:2: line longer than 8 bytes"):
        list(iter_jsonl_lines(path, max_line_bytes=8))


def test_an_empty_source_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text("")
    (tmp_path / "q.jsonl").write_text(GOOD)
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "name: r\nkind: math\nsources:\n"
        "  - {name: empty, path: p.jsonl, fields: {}}\n"
        "  - {name: full, path: q.jsonl, fields: {}}\n"
    )
    result = runner.invoke(app, ["build", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"source empty: {tmp_path / 'p.jsonl'} holds no rows" in " ".join(result.output.split())
    assert "wrote 1 rows" in result.output
