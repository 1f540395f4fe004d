"""One build folder, one build at a time: a second build exits naming the first (or waits for
it), the cache checks its files before reusing them and follows the code that made them, and
what a killed build left is removed by the next."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_data.build import build
from rstar2_data.recipe import load_recipe

SRC = Path(__file__).resolve().parents[1] / "src"
CLI = "import sys; from rstar2_data.cli import app; sys.argv[0] = 'rstar2-data'; app()"


def recipe_file(tmp_path: Path, rows: int) -> Path:
    """A recipe over ``rows`` problems; every 9th answer is a fraction, every 5th problem
    repeats an earlier one."""
    data = tmp_path / "p.jsonl"
    with data.open("w") as handle:
        for i in range(rows):
            answer = f"{i}/7" if i % 9 == 8 else str(i)
            text = f"Problem {i - 1 if i % 5 == 4 else i}: how many ways are there to tile it?"
            handle.write(json.dumps({"uid": f"u{i}", "q": text, "a": answer}) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"""
name: folder
kind: math
sources: [{{name: s, path: {data}, fields: {{id: uid, problem: q, answer: a}}}}]
filters: [{{type: integer_answer}}, {{type: dedup}}]
"""
    )
    return recipe


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def command(recipe: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", CLI, "build", str(recipe), "--out", str(out), *extra]


def read_line_with(stream: int, text: str, timeout: float = 120) -> str:
    """Lines of the pipe ``stream`` until one holds ``text``."""
    seen = b""
    while True:
        ready, _, _ = select.select([stream], [], [], timeout)
        assert ready, f"no {text!r} within {timeout} s: {seen.decode()}"
        chunk = os.read(stream, 1)
        assert chunk, f"the pipe closed before {text!r}: {seen.decode()}"
        seen += chunk
        if chunk == b"\n" and text.encode() in seen.splitlines()[-1]:
            return seen.splitlines()[-1].decode()


def test_a_second_build_into_a_busy_folder_exits_2_naming_the_first_or_waits(
    tmp_path: Path,
) -> None:
    recipe = recipe_file(tmp_path, 20_000)
    subprocess.run(command(recipe, tmp_path / "ref", "--no-progress"), check=True)
    out = tmp_path / "out"
    # The first build logs a line every 200 rows into a one-page pipe that is read only up
    # to its first checkpoint: it then blocks mid-filter, holding the folder.
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    first = subprocess.Popen(
        command(recipe, out, "--no-progress", "-v", "--checkpoint-rows", "200"),
        stderr=write_end,
        env={**os.environ, "COLUMNS": "200"},
    )
    os.close(write_end)
    try:
        read_line_with(read_end, "checkpoint at row")
        second = subprocess.run(
            command(recipe, out, "--no-progress"), capture_output=True, text=True
        )
        assert second.returncode == 2, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith("error: ")
        assert f"being built by process {first.pid}" in line
        # --wait: starts once the first build is done, and finds its work finished.
        waiting = subprocess.Popen(
            command(recipe, out, "--no-progress", "--wait", "-v"),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        assert waiting.stderr is not None
        line = read_line_with(waiting.stderr.fileno(), "waiting for process")
        assert str(first.pid) in line
        with open(read_end, "rb", closefd=False) as rest:
            rest.read()  # unblock the first build and let it finish
        assert first.wait(timeout=120) == 0
        rest_of_wait = waiting.stderr.read().decode()
        assert waiting.wait(timeout=120) == 0, rest_of_wait
        assert "filter integer_answer > dedup: reused" in rest_of_wait
    finally:
        os.close(read_end)
        first.kill()
    assert sha(out / "data.jsonl") == sha(tmp_path / "ref" / "data.jsonl")
    assert not (out / ".lock").exists()


def cached(out: Path, pattern: str) -> Path:
    (path,) = (out / ".cache").glob(pattern)
    return path


def test_a_filter_checkpoint_that_disagrees_with_its_data_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = load_recipe(recipe_file(tmp_path, 3000))
    reference = build(recipe, tmp_path / "ref", progress=False)
    out = tmp_path / "out"
    build(recipe, out, progress=False)
    # Two writers' lines in one file (what two builds into one folder left): more lines in
    # the recorded bytes than the checkpoint counts as kept.
    data = cached(out, "filter-*.jsonl")
    short = b'{"id": "x", "source": "s", "problem": "p", "answer": "1", "metadata": {}}\n'
    data.write_bytes(short * (data.stat().st_size // len(short) + 1))
    (out / "data.jsonl").unlink()
    with caplog.at_level(logging.WARNING):
        assert build(recipe, out, progress=False) == reference
    assert "does not hold the" in caplog.text
    assert "filtering anew" in caplog.text
    assert sha(out / "data.jsonl") == reference.content_sha256
    # A checkpoint record that does not parse: the same.
    cached(out, "filter-*.json").write_text('{"done": tru')
    (out / "data.jsonl").unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert build(recipe, out, progress=False) == reference
    assert "is not a valid checkpoint; filtering anew" in caplog.text


def test_a_source_cache_file_that_changed_is_converted_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = load_recipe(recipe_file(tmp_path, 500))
    reference = build(recipe, tmp_path / "ref", progress=False)
    out = tmp_path / "out"
    build(recipe, out, progress=False)
    converted = cached(out, "source-s-*.jsonl")
    converted.write_text(converted.read_text().replace("Problem 3:", "Problem 333:"))
    for path in (*(out / ".cache").glob("filter-*"), out / "data.jsonl"):
        path.unlink()
    with caplog.at_level(logging.WARNING):
        assert build(recipe, out, progress=False) == reference
    assert "converting the source anew" in caplog.text
    assert sha(out / "data.jsonl") == reference.content_sha256


def test_an_edited_filter_rebuilds_its_stage(tmp_path: Path) -> None:
    # A copy of the package's code, first on the path of the builds below.
    code = tmp_path / "code"
    shutil.copytree(SRC, code, ignore=shutil.ignore_patterns("__pycache__"))
    recipe = recipe_file(tmp_path, 300)
    env = {**os.environ, "PYTHONPATH": str(code)}
    run = [*command(recipe, tmp_path / "out", "--no-progress", "-v")]
    subprocess.run(run, check=True, env=env, capture_output=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["filters"][0]["removed"] == {"answer is not an integer": 33}
    rerun = subprocess.run(run, check=True, env=env, capture_output=True, text=True)
    assert "filter integer_answer > dedup: reused" in rerun.stderr
    # Same version, other behaviour: the filter keeps fractions now.
    answers = code / "rstar2_data" / "filters" / "answers.py"
    edited = answers.read_text().replace(
        'return "answer is not an integer"', "return None if '/' in row.answer else 'no'"
    )
    assert edited != answers.read_text()
    answers.write_text(edited)
    rerun = subprocess.run(run, check=True, env=env, capture_output=True, text=True)
    assert "filter integer_answer > dedup: reused" not in rerun.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["filters"][0]["removed"] == {}
    assert manifest["rows"] == 300 - 60  # only dedup's repeats are gone


KILLED_IN_WRITE = """
import os, signal, sys
import rstar2_data.output as output

written = output._counted


def killed(lines, stage):
    for count, line in enumerate(written(lines, stage)):
        if count == 500:
            os.kill(os.getpid(), signal.SIGKILL)
        yield line


output._counted = killed
from rstar2_data.cli import app

sys.argv[0] = "rstar2-data"
app()
"""


def test_what_a_build_killed_while_writing_left_is_removed_by_the_next(tmp_path: Path) -> None:
    recipe = recipe_file(tmp_path, 3000)
    reference = build(load_recipe(recipe), tmp_path / "ref", progress=False)
    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_IN_WRITE, "build", str(recipe), "--out", str(out)],
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGKILL
    (left,) = out.glob(".data.jsonl.*.tmp")
    assert left.stat().st_size > 0
    rebuilt = subprocess.run(command(recipe, out, "--no-progress", "-v"), capture_output=True)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert b"removed 1 files and folders an interrupted build left" in rebuilt.stderr
    assert not [path for path in out.rglob("*") if path.name.endswith(".tmp")]
    assert sha(out / "data.jsonl") == reference.content_sha256
