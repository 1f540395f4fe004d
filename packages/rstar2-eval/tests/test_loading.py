"""Benchmark registry and loaders: shared local files, hub field mapping, bad rows."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rstar2_eval import BENCHMARKS, InputError, get_benchmark, load_benchmark, normalize_answer
from rstar2_eval.loading import load_hub


@pytest.mark.parametrize(
    ("name", "rows", "first_id"),
    [("aime24", 30, "60"), ("aime25", 30, "0"), ("amc23", 40, "0"), ("math500", 500, None)],
)
def test_shared_files_load(data_dir: Path, name: str, rows: int, first_id: str | None) -> None:
    problems = load_benchmark(name, data_dir)
    assert len(problems) == rows
    assert len({p.id for p in problems}) == rows
    if first_id is not None:
        assert problems[0].id == first_id
    assert all(p.problem and p.answer for p in problems)


def test_answer_types_are_normalized(data_dir: Path) -> None:
    aime24 = {p.id: p for p in load_benchmark("aime24", data_dir)}
    assert aime24["67"].answer == "25"  # stored as "025"
    assert {p.answer_kind for p in aime24.values()} == {"integer"}
    amc23 = load_benchmark("amc23", data_dir)
    assert amc23[0].answer == "27"  # stored as 27.0
    assert amc23[15].answer == "-1"  # stored as -1.0


def test_math500_keeps_latex_answers_and_metadata(data_dir: Path) -> None:
    math500 = {p.id: p for p in load_benchmark("math500", data_dir)}
    first = math500["test/precalculus/807.json"]
    assert first.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert first.answer_kind == "expression"
    assert first.metadata["level"] == 2
    assert "problem" not in first.metadata
    kinds = [p.answer_kind for p in math500.values()]
    assert 0 < kinds.count("integer") < len(kinds)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("025", ("25", "integer")),
        (27.0, ("27", "integer")),
        (70, ("70", "integer")),
        ("1,000", ("1000", "integer")),
        (0.5, ("0.5", "expression")),
        (r" \frac{1}{2} ", (r"\frac{1}{2}", "expression")),
    ],
)
def test_normalize_answer(value: object, expected: tuple[str, str]) -> None:
    assert normalize_answer(value) == expected


def test_a_gold_beyond_the_int_string_limit_loads_as_digits() -> None:
    digits = "5" * 5000  # int(text) refuses more than 4,300 digits
    assert normalize_answer(f"00{digits}") == (digits, "integer")


@pytest.mark.parametrize("value", [True, None, [1], ""])
def test_normalize_answer_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="expected"):
        normalize_answer(value)


def test_registry_covers_the_paper_benchmarks() -> None:
    assert set(BENCHMARKS) == {
        "aime24",
        "aime25",
        "hmmt25",
        "math500",
        "amc23",
        "gpqa-diamond",
        "humaneval",
        "ifeval",
        "livecodebench",
    }
    assert get_benchmark("gpqa-diamond").answer_format == "choice"
    with pytest.raises(KeyError, match="known benchmarks: aime24"):
        get_benchmark("aime23")


def test_missing_local_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"hmmt25\.jsonl: no local copy of hmmt25"):
        load_benchmark("hmmt25", tmp_path)


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_bad_rows_name_line_and_field(tmp_path: Path) -> None:
    _write(tmp_path / "aime25.jsonl", [{"id": "0", "problem": "p", "answer": 1}, {"id": "1"}])
    with pytest.raises(InputError) as caught:
        load_benchmark("aime25", tmp_path)
    assert (caught.value.line, caught.value.field) == (2, "problem")

    _write(tmp_path / "aime25.jsonl", [{"id": "0", "problem": "p", "answer": True}])
    with pytest.raises(InputError, match="line 1, field 'answer': expected a string or number"):
        load_benchmark("aime25", tmp_path)

    _write(tmp_path / "aime25.jsonl", [{"problem": "p", "answer": 1, "id": 3}] * 2)
    with pytest.raises(InputError, match="line 2, field 'id': duplicate problem id '3'"):
        load_benchmark("aime25", tmp_path)

    (tmp_path / "aime25.jsonl").write_text('{"id": 1, "problem": "p", "answer": 1}\n[1]\n')
    with pytest.raises(InputError, match="line 2: expected a JSON object, got list"):
        load_benchmark("aime25", tmp_path)


def _fake_datasets(
    monkeypatch: pytest.MonkeyPatch, tables: dict[Any, list[dict[str, Any]]]
) -> list[Any]:
    calls: list[Any] = []

    def load_dataset(path: str, config: str | None, split: str) -> list[dict[str, Any]]:
        calls.append((path, config, split))
        return tables[(path, config, split)]

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    # A hub that answers, as the fake stands for one (checked before datasets is imported).
    monkeypatch.setattr("rstar2_data.hub.hub_problem", lambda: None)
    return calls


def test_hub_configs_concatenate_with_positional_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    part_one = [{"question": f"q{i}", "answer": str(i)} for i in range(2)]
    part_two = [{"question": "q2", "answer": "007"}]
    calls = _fake_datasets(
        monkeypatch,
        {
            ("opencompass/AIME2025", "AIME2025-I", "test"): part_one,
            ("opencompass/AIME2025", "AIME2025-II", "test"): part_two,
        },
    )
    problems = load_hub(get_benchmark("aime25"))
    assert [(p.id, p.problem, p.answer) for p in problems] == [
        ("0", "q0", "0"),
        ("1", "q1", "1"),
        ("2", "q2", "7"),
    ]
    assert [config for _, config, _ in calls] == ["AIME2025-I", "AIME2025-II"]
    assert problems[0].source == "opencompass/AIME2025"


def test_gpqa_options_are_shuffled_deterministically(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        {
            "Record ID": f"rec{i}",
            "Question": f"Which is right ({i})?",
            "Correct Answer": "right",
            "Incorrect Answer 1": "wrong one",
            "Incorrect Answer 2": "wrong two",
            "Incorrect Answer 3": "wrong three",
        }
        for i in range(12)
    ]
    _fake_datasets(monkeypatch, {("Idavidrein/gpqa", "gpqa_diamond", "train"): rows})
    first = load_hub(get_benchmark("gpqa-diamond"))
    again = load_hub(get_benchmark("gpqa-diamond"))
    assert [p.problem for p in first] == [p.problem for p in again]
    for problem in first:
        assert f"{problem.answer}) right" in problem.problem
        assert all(f"{letter}) " in problem.problem for letter in "ABCD")
    # Over 12 problems the correct option does not sit in one place.
    assert len({p.answer for p in first}) > 1
