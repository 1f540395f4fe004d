"""Streamed builds: checkpoints and resumption, the external shuffle, parallel checks, stage
progress, and row numbers in messages."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rstar2_data.build import build, load_built
from rstar2_data.filters import IntegerAnswer
from rstar2_data.output import permutation
from rstar2_data.progress import Stages
from rstar2_data.recipe import load_recipe

WORDS = ["alpha", "beta", "gamma", "delta", "sum", "product", "prime", "circle", "square"]


def corpus(path: Path, rows: int, *, seed: int = 0) -> Path:
    """Problems of random words and numbers; every 7th repeats an earlier one reformatted
    (dedup must remember it across checkpoints); every 11th answer is not an integer."""
    rng = random.Random(seed)
    texts: list[str] = []
    with path.open("w") as handle:
        for i in range(rows):
            if i % 7 == 6:
                text = rng.choice(texts).upper()
            else:
                words = [rng.choice(WORDS) for _ in range(rng.randint(12, 30))]
                text = " ".join(words) + f" with {rng.randint(1, 10**6)}?"
                texts.append(text)
            answer: Any = "\\\\frac{1}{2}" if i % 11 == 10 else rng.randint(0, 999)
            handle.write(json.dumps({"uid": f"r{i}", "q": text, "a": answer}) + "\n")
    return path


def recipe_path(tmp_path: Path, data: Path, *, shuffle: bool = True) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"""
name: stream
kind: math
sources: [{{name: s, path: {data}, fields: {{id: uid, problem: q, answer: a}}}}]
filters:
  - {{type: integer_answer}}
  - {{type: dedup}}
output: {{shuffle: {str(shuffle).lower()}}}
"""
    )
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 1000])
def test_permutation_is_random_shuffle_of_row_numbers(n: int) -> None:
    rows = list(range(n))
    random.Random("7:shuffle").shuffle(rows)
    assert list(permutation(n, "7:shuffle")) == rows


def test_bucketed_shuffle_and_checkpoints_do_not_change_the_bytes(tmp_path: Path) -> None:
    recipe = load_recipe(recipe_path(tmp_path, corpus(tmp_path / "c.jsonl", 3000)))
    plain = build(recipe, tmp_path / "plain", progress=False)
    # Shuffle buckets of ~2 KB (dozens of files) and a checkpoint every 97 rows.
    small = build(recipe, tmp_path / "small", progress=False, checkpoint_rows=97, bucket_bytes=2048)
    assert small == plain
    assert sha(tmp_path / "small" / "data.jsonl") == plain.content_sha256
    rows = [json.loads(line) for line in (tmp_path / "plain" / "data.jsonl").open()]
    unshuffled = build(
        recipe.model_copy(update={"output": recipe.output.model_copy(update={"shuffle": False})}),
        tmp_path / "ordered",
        progress=False,
    )
    ordered = [json.loads(line) for line in (tmp_path / "ordered" / "data.jsonl").open()]
    random.Random(f"{recipe.seed}:shuffle").shuffle(ordered)
    assert rows == ordered
    assert unshuffled.rows == plain.rows


def test_an_interrupted_filter_stage_resumes_at_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = load_recipe(recipe_path(tmp_path, corpus(tmp_path / "c.jsonl", 2000)))
    reference = build(recipe, tmp_path / "ref", progress=False)
    calls = 0
    check = IntegerAnswer.check

    def interrupted(self: IntegerAnswer, item: Any) -> str | None:
        nonlocal calls
        calls += 1
        if calls == 1234:
            raise KeyboardInterrupt
        return check(self, item)

    monkeypatch.setattr(IntegerAnswer, "check", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, tmp_path / "out", progress=False, checkpoint_rows=500)
    assert not (tmp_path / "out" / "data.jsonl").exists()
    monkeypatch.setattr(IntegerAnswer, "check", check)
    with caplog.at_level(logging.INFO):
        resumed = build(recipe, tmp_path / "out", progress=False, checkpoint_rows=500)
    assert "resuming at row 1000 of 2000" in caplog.text
    assert "source s: reused 2000 rows" in caplog.text
    assert resumed == reference
    assert sha(tmp_path / "out" / "data.jsonl") == reference.content_sha256


def test_sigint_mid_filter_then_rerun_writes_identical_bytes(tmp_path: Path) -> None:
    data = corpus(tmp_path / "c.jsonl", 40_000)
    recipe = recipe_path(tmp_path, data)
    script = Path(sys.executable).parent / "rstar2-data"
    command = [str(script), "build", str(recipe), "--no-progress"]
    reference = subprocess.run(
        [*command, "--out", str(tmp_path / "ref")], capture_output=True, text=True, check=True
    )
    assert "wrote" in reference.stdout
    out = ["--out", str(tmp_path / "out"), "--checkpoint-rows", "200", "-v"]
    env = {**os.environ, "COLUMNS": "200"}
    # A one-page pipe: the build blocks on its log lines (a checkpoint line every 200 rows, far
    # more than two pages in all) until they are read, so it cannot finish before the Ctrl-C
    # however slowly this process is scheduled.
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    # Ctrl-C as in a terminal, even when this suite itself runs with SIGINT ignored (started in
    # the background by a non-interactive shell), which the build would inherit.
    process = subprocess.Popen(
        [*command, *out],
        stderr=write_end,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(write_end)
    with open(read_end, encoding="utf-8") as stderr:
        for line in stderr:  # the first checkpoint of the filter stage, then Ctrl-C
            if "checkpoint at row" in line:
                process.send_signal(signal.SIGINT)
                break
        rest = stderr.read()
    assert process.wait(timeout=120) == 130, rest
    assert "run the same command again to resume" in rest
    rerun = subprocess.run([*command, *out], capture_output=True, text=True, env=env, check=True)
    resumed_at = int(rerun.stderr.split("resuming at row ")[1].split()[0])
    assert 0 < resumed_at < 40_000
    assert sha(tmp_path / "out" / "data.jsonl") == sha(tmp_path / "ref" / "data.jsonl")
    assert (tmp_path / "out" / "manifest.json").read_text() == (
        tmp_path / "ref" / "manifest.json"
    ).read_text().replace(str(tmp_path / "ref"), str(tmp_path / "out"))


def test_parallel_checks_give_the_same_output(tmp_path: Path) -> None:
    recipe = load_recipe(recipe_path(tmp_path, corpus(tmp_path / "c.jsonl", 4000)))
    one = build(recipe, tmp_path / "one", progress=False)
    # Two windows of 2,000 rows, each mapped by 2 processes.
    two = build(recipe, tmp_path / "two", progress=False, num_proc=2, checkpoint_rows=2000)
    assert two == one
    assert not list((tmp_path / "two" / ".cache").glob("hf-*"))


def test_each_stage_shows_one_line_with_name_total_and_rate() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with Stages(enabled=True, console=console) as stages:
        with stages.stage("source s", 4096) as stage:
            stage.advance(4096)
        stages.reused("filter integer_answer > dedup", 4000)
    last = buffer.getvalue().split("\x1b[2K")[-2:]  # the final frame of each line
    text = "".join(last) + buffer.getvalue()
    for shown in ("source s", "4096/4096", "rows/s", "filter integer_answer > dedup (reused)"):
        assert shown in text
    assert "4000/4000" in text


def test_messages_name_the_files_1_based_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = [json.dumps({"problem": f"P{i}?", "answer": i}) for i in range(99)]
    lines.insert(50, "")  # a blank line: rows and lines part from here
    lines.append(json.dumps({"problem": "No answer?"}))  # line 101, the 100th row
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    recipe = recipe_path(tmp_path, tmp_path / "p.jsonl")
    recipe.write_text("name: r\nkind: math\nsources: [{name: s, path: p.jsonl, fields: {}}]\n")
    with caplog.at_level(logging.WARNING):
        manifest = build(load_recipe(recipe), tmp_path / "out", progress=False)
    assert f"{tmp_path / 'p.jsonl'}:101: missing field answer" in caplog.text
    assert manifest.sources[0].malformed == {"missing field answer": 1}
    # The reader of built files names lines the same way.
    data = tmp_path / "out" / "data.jsonl"
    data.write_text(data.read_text() + "\n" + '{"id": "x"}\n')
    with pytest.raises(ValueError, match=r"data\.jsonl:101: "):
        load_built_unchecked(data)


def load_built_unchecked(path: Path) -> None:
    from rstar2_data.rows import read_rows

    read_rows(path, kind="math")


def test_a_duplicated_benchmark_copy_counts_as_contaminated(tmp_path: Path) -> None:
    bench = "Find the number of ways to tile a three by eleven board with dominoes and trominoes."
    (tmp_path / "b.jsonl").write_text(json.dumps({"problem": bench}) + "\n")
    rows = [{"problem": bench, "answer": 1}, {"problem": bench.upper(), "answer": 1}]
    rows += [{"problem": f"Ordinary problem {i}.", "answer": i} for i in range(3)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        """
name: r
kind: math
sources: [{name: t, path: t.jsonl, fields: {}}]
filters:
  - {type: dedup}
  - {type: decontaminate, benchmarks: [{name: b, path: b.jsonl}]}
"""
    )
    manifest = build(load_recipe(recipe), tmp_path / "out", progress=False)
    dedup, decontam = manifest.filters
    assert dedup.removed == {"duplicate (normalized)": 1}
    assert decontam.removed == {"overlaps b (8-grams)": 1}
    assert decontam.also_matched == {"overlaps b (8-grams)": 1}
    assert len(load_built(tmp_path / "out")) == 3
