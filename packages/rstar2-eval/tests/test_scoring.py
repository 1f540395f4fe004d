"""Scoring generations: metrics against hand-computed values, input errors, the CLI outputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import fmean

import pytest
from typer.testing import CliRunner

from rstar2_data.schemas import GradedSample
from rstar2_data.terminal import cut_words
from rstar2_eval import Grader, InputError, load_benchmark, pass_at_k, read_generations
from rstar2_eval.cli import app
from rstar2_eval.scoring import ScoreReport, score_generations

SAMPLES = 4


def _aime24_lines(data_dir: Path) -> tuple[list[dict[str, object]], list[int]]:
    """4 samples per aime24 problem; problem j gets j % 5 correct ones, first in sample order."""
    lines: list[dict[str, object]] = []
    correct_counts: list[int] = []
    for j, problem in enumerate(load_benchmark("aime24", data_dir)):
        correct = j % 5 if j % 5 <= SAMPLES else SAMPLES
        correct_counts.append(correct)
        for i in range(SAMPLES):
            if i < correct:
                answer = f"<answer>\\boxed{{{problem.answer}}}</answer>"
            elif correct == 0 and i == SAMPLES - 1:
                answer = "I ran out of ideas."
            else:
                answer = f"<answer>\\boxed{{{int(problem.answer) + 1}}}</answer>"
            lines.append(
                {
                    "benchmark": "aime24",
                    "problem_id": int(problem.id),  # numbers are accepted as ids
                    "sample_index": i,
                    "response": f"<reason>work</reason>{answer}",
                    "response_tokens": 100 * (i + 1),
                    "tool_calls": 2,
                    "tool_errors": 1 if i % 2 == 0 else 0,
                    "truncated": i == SAMPLES - 1,
                }
            )
    return lines, correct_counts


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_metrics_match_hand_computation(tmp_path: Path, data_dir: Path, grader: Grader) -> None:
    lines, counts = _aime24_lines(data_dir)
    path = _write_jsonl(tmp_path / "gen.jsonl", lines)
    result = score_generations(
        read_generations(path),
        {"aime24": load_benchmark("aime24", data_dir)},
        grader,
        origin=str(path),
    )
    (score,) = result.report.benchmarks
    assert score.problems == score.problems_in_benchmark == 30
    assert score.samples == 120
    assert score.missing_problems == []
    assert score.avg == pytest.approx(fmean(c / SAMPLES for c in counts))
    for k in (1, 2, 4):
        expected = fmean(pass_at_k(SAMPLES, c, k) for c in counts)
        assert score.pass_at_k[k] == pytest.approx(expected)
    # Correct samples come first and all wrong ones agree: a 2-2 tie goes to the correct answer.
    assert score.maj_at_k[4] == pytest.approx(fmean(c >= 2 for c in counts))
    assert score.maj_at_k[1] == pytest.approx(fmean(c >= 1 for c in counts))
    assert score.statuses.correct == sum(counts)
    assert score.statuses.no_answer == counts.count(0)
    assert score.mean_response_tokens == pytest.approx(250.0)
    assert score.tool_calls_per_response == pytest.approx(2.0)
    assert score.tool_error_ratio == pytest.approx(0.25)
    assert score.truncation_rate == pytest.approx(0.25)
    problem = next(p for p in result.problems if p.problem_id == "67")  # gold "025"
    assert (problem.gold, problem.correct) == ("25", counts[7])


def test_partial_coverage_reports_missing_problems(
    tmp_path: Path, data_dir: Path, grader: Grader
) -> None:
    lines, _ = _aime24_lines(data_dir)
    path = _write_jsonl(tmp_path / "gen.jsonl", [x for x in lines if x["problem_id"] != 60])
    result = score_generations(
        read_generations(path), {"aime24": load_benchmark("aime24", data_dir)}, grader, origin="g"
    )
    (score,) = result.report.benchmarks
    assert (score.problems, score.missing_problems) == (29, ["60"])


def test_unknown_problem_names_line_and_field(
    tmp_path: Path, data_dir: Path, grader: Grader
) -> None:
    lines, _ = _aime24_lines(data_dir)
    lines[5]["problem_id"] = "nope"
    path = _write_jsonl(tmp_path / "gen.jsonl", lines)
    with pytest.raises(InputError) as caught:
        score_generations(
            read_generations(path),
            {"aime24": load_benchmark("aime24", data_dir)},
            grader,
            origin="g",
        )
    assert (caught.value.line, caught.value.field) == (6, "problem_id")


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        (
            {"benchmark": "aime24", "problem_id": "60", "sample_index": 0},
            "response",
            "Field required",
        ),
        (
            {"benchmark": "aime24", "problem_id": "60", "sample_index": -1, "response": ""},
            "sample_index",
            "greater than or equal to 0",
        ),
        (
            {
                "benchmark": "aime24",
                "problem_id": "60",
                "sample_index": 0,
                "response": "",
                "tool_calls": 1,
                "tool_errors": 2,
            },
            None,
            "exceeds tool_calls",
        ),
        (
            {
                "benchmark": "aime24",
                "problem_id": "60",
                "sample_index": 0,
                "response": "",
                "extra": 1,
            },
            "extra",
            "Extra inputs",
        ),
    ],
)
def test_bad_generation_lines(
    tmp_path: Path, line: dict[str, object], field: str | None, message: str
) -> None:
    good = {"benchmark": "aime24", "problem_id": "61", "sample_index": 0, "response": ""}
    path = _write_jsonl(tmp_path / "gen.jsonl", [good, line])
    with pytest.raises(InputError, match=message) as caught:
        read_generations(path)
    assert (caught.value.line, caught.value.field) == (2, field)


def test_duplicate_sample_is_an_error(tmp_path: Path) -> None:
    row = {"benchmark": "aime24", "problem_id": "61", "sample_index": 3, "response": ""}
    path = _write_jsonl(tmp_path / "gen.jsonl", [row, row])
    with pytest.raises(InputError, match="already appeared on line 1"):
        read_generations(path)


def test_cli_score_writes_every_output(tmp_path: Path, data_dir: Path) -> None:
    lines, counts = _aime24_lines(data_dir)
    math500 = [p for p in load_benchmark("math500", data_dir) if p.answer_kind != "integer"][:3]
    for i, problem in enumerate(math500):
        lines.append(
            {
                "benchmark": "math500",
                "problem_id": problem.id,
                "sample_index": 0,
                "response": f"<answer>\\boxed{{{problem.answer}}}</answer>" if i else r"\boxed{0}",
            }
        )
    path = _write_jsonl(tmp_path / "run.jsonl", lines)
    samples_out = tmp_path / "graded.jsonl"
    result = CliRunner(env={"COLUMNS": "250"}).invoke(
        app,
        [
            "score",
            str(path),
            "--data-dir",
            str(data_dir),
            "--out",
            str(tmp_path / "out"),
            "--plot",
            "--samples-out",
            str(samples_out),
            "--workers",
            "1",
            "--boxed-fallback",
        ],
    )
    assert result.exit_code == 0, result.output
    report = ScoreReport.model_validate_json((tmp_path / "out" / "run.report.json").read_text())
    assert [s.benchmark for s in report.benchmarks] == ["aime24", "math500"]
    assert report.boxed_fallback
    aime24, math = report.benchmarks
    assert aime24.avg == pytest.approx(fmean(c / SAMPLES for c in counts))
    assert (math.samples, math.statuses.correct, math.boxed_fallback_used) == (3, 2, 1)
    with (tmp_path / "out" / "run.problems.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 33
    assert {"pass@1", "pass@2", "pass@4"} <= set(rows[0])
    assert (tmp_path / "out" / "run.scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    graded = [GradedSample.model_validate_json(x) for x in samples_out.read_text().splitlines()]
    assert len(graded) == len(lines)
    assert sum(g.correct for g in graded) == sum(counts) + 2
    assert "aime24" in result.output


def test_cli_reports_bad_input_with_line_and_field(tmp_path: Path, data_dir: Path) -> None:
    good = {"benchmark": "aime24", "problem_id": "60", "sample_index": 0, "response": ""}
    bad = {**good, "sample_index": 1, "benchmark": "aime23"}
    path = _write_jsonl(tmp_path / "run.jsonl", [good, bad])
    result = CliRunner(env={"COLUMNS": "250"}).invoke(
        app, ["score", str(path), "--data-dir", str(data_dir)]
    )
    assert result.exit_code == 2
    assert "line 2, field 'benchmark': unknown benchmark 'aime23'" in " ".join(
        result.output.split()
    )
    assert not (tmp_path / "run.report.json").exists()


def _tiny_score_command(folder: Path) -> list[str]:
    """``rstar2-eval score`` of 2 samples on each of 2 problems of a local problem set."""
    problems = [
        {"id": f"p{i}", "source": "t", "problem": "1+1?", "answer": "2", "answer_kind": "integer"}
        for i in range(2)
    ]
    lines = [
        {"benchmark": "tiny", "problem_id": f"p{i}", "sample_index": j, "response": "<answer>2"}
        for i in range(2)
        for j in range(2)
    ]
    problem_file = _write_jsonl(folder / "problems.jsonl", problems)
    generations = _write_jsonl(folder / "gen.jsonl", lines)
    return ["score", str(generations), "--benchmarks", f"tiny={problem_file}", "--workers", "1"]


def test_out_dir_is_a_hidden_old_name_of_out(tmp_path: Path) -> None:
    score = _tiny_score_command(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, [*score, "--out-dir", str(tmp_path / "old")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "old" / "gen.report.json").is_file()
    clash = runner.invoke(app, [*score, "--out", str(tmp_path / "a"), "--out-dir", str(tmp_path)])
    assert clash.exit_code == 2
    assert "give --out only" in clash.output
    assert "--out-dir" not in runner.invoke(app, ["score", "--help"]).output


@pytest.mark.parametrize("command", [[], ["run"], ["score"], ["benchmarks"]])
def test_help_fits_80_columns_without_cutting_a_word(command: list[str]) -> None:
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "--help"]).output
    wide = CliRunner(env={"COLUMNS": "1000"}).invoke(app, [*command, "--help"]).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)


def test_tables_fit_80_columns_without_cutting_a_word(tmp_path: Path) -> None:
    score = _tiny_score_command(tmp_path)
    for command in (score, ["benchmarks"]):
        narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, command)
        wide = CliRunner(env={"COLUMNS": "1000"}).invoke(app, command)
        assert narrow.exit_code == wide.exit_code == 0, narrow.output
        # Paths are printed whole (a terminal wraps them where it must; they copy as one).
        tables = [line for line in narrow.output.splitlines() if not line.startswith("wrote ")]
        assert max(len(line) for line in tables) <= 80
        assert not cut_words(narrow.output, wide.output)
        assert ("tool err %" in wide.output) == (command == score)


def test_cli_lists_benchmarks() -> None:
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["benchmarks"])
    assert result.exit_code == 0
    assert "MathArena/hmmt_feb_2025" in result.output
    assert "gpqa-diamond" in result.output


def test_cli_help_explains_every_option() -> None:
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["score", "--help"])
    assert result.exit_code == 0
    for option in (
        "--data-dir",
        "--out",
        "--plot",
        "--samples-out",
        "--k",
        "--timeout",
        "--workers",
        "--boxed-fallback",
        "--max-answer-chars",
    ):
        assert option in result.output


def test_requested_k_values_and_answer_block_counts(
    tmp_path: Path, data_dir: Path, grader: Grader
) -> None:
    lines, counts = _aime24_lines(data_dir)
    gold = load_benchmark("aime24", data_dir)[0].answer
    # Problem 0 had no correct sample; its first one now answers twice, last answer right.
    lines[0]["response"] = rf"<answer>\boxed{{1}}</answer> hmm <answer>\boxed{{{gold}}}</answer>"
    counts[0] += 1
    path = _write_jsonl(tmp_path / "gen.jsonl", lines)
    result = score_generations(
        read_generations(path),
        {"aime24": load_benchmark("aime24", data_dir)},
        grader,
        origin=str(path),
        ks=[3, 16],
    )
    (score,) = result.report.benchmarks
    # k=16 exceeds the 4 samples per problem and is left out (with a warning).
    assert set(score.pass_at_k) == set(score.maj_at_k) == {3}
    assert score.multiple_answer_blocks == 1
    assert score.pass_at_k[3] == pytest.approx(fmean(pass_at_k(SAMPLES, c, 3) for c in counts))
