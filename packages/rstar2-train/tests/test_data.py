"""Rows from data sources, and a data order that resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_runs import DemoData

from rstar2_train import DataOrder, load_rows
from rstar2_train.config import DataSource


def test_order_is_a_seeded_permutation_per_epoch() -> None:
    order = DataOrder(5, seed=1)
    first, second = order.take(5), order.take(5)
    assert sorted(first) == sorted(second) == [0, 1, 2, 3, 4]
    assert first != second  # a new permutation each epoch
    assert DataOrder(5, seed=1).take(10) == first + second
    assert DataOrder(5, seed=1, shuffle=False).take(7) == [0, 1, 2, 3, 4, 0, 1]


def test_a_restored_order_continues_where_it_stopped() -> None:
    whole = DataOrder(7, seed=3).take(30)
    order = DataOrder(7, seed=3)
    head = order.take(11)
    restored = DataOrder(7, seed=3)
    restored.load_state_dict(order.state_dict())
    assert head + restored.take(19) == whole
    assert restored.consumed == 30
    with pytest.raises(ValueError, match="resume with the same data"):
        DataOrder(8, seed=3).load_state_dict(order.state_dict())


def test_rows_of_the_wrong_kind_are_refused(demo_data: DemoData, tmp_path: Path) -> None:
    problems = load_rows(DataSource(file=str(demo_data.problems)), "math", tmp_path)
    assert [p.id for p in problems] == ["p0", "p1", "p2"]
    assert len(load_rows(DataSource(file=str(demo_data.problems), limit=2), "math", tmp_path)) == 2
    with pytest.raises(ValueError, match="holds MathProblem rows; this stage needs ChatExample"):
        load_rows(DataSource(file=str(demo_data.problems)), "chat", tmp_path)
    with pytest.raises(FileNotFoundError, match="data file not found"):
        load_rows(DataSource(file=str(tmp_path / "none.jsonl")), "math", tmp_path)


def test_a_recipe_is_built_once_into_the_run(tmp_path: Path) -> None:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        "name: tiny-demo\nkind: math\nseed: 0\nsources:\n  - name: demo\n    synthetic: demo\n"
        "    demo:\n      n: 12\n      levels: [1]\noutput:\n  format: jsonl\n"
    )
    rows = load_rows(DataSource(recipe=str(recipe)), "math", tmp_path / "data")
    built = tmp_path / "data" / "tiny-demo" / "data.jsonl"
    stamp = built.stat().st_mtime_ns
    again = load_rows(DataSource(recipe=str(recipe)), "math", tmp_path / "data")
    assert [r.id for r in again] == [r.id for r in rows]
    assert len(rows) == 12
    assert built.stat().st_mtime_ns == stamp  # not rebuilt


def test_a_recipe_over_a_changed_file_is_rebuilt(tmp_path: Path) -> None:
    source = tmp_path / "problems.jsonl"
    recipe = tmp_path / "local.yaml"
    recipe.write_text(
        f"name: local\nkind: math\nseed: 0\nsources:\n  - name: mine\n    path: {source}\n"
        "    fields: {problem: problem, answer: answer, id: id}\n"
        "output:\n  format: jsonl\n  shuffle: false\n"
    )

    def write(n: int) -> None:
        source.write_text(
            "".join(
                f'{{"id": "q{i}", "problem": "What is {i}+1?", "answer": "{i + 1}"}}\n'
                for i in range(n)
            )
        )

    write(6)
    assert len(load_rows(DataSource(recipe=str(recipe)), "math", tmp_path / "data")) == 6
    write(3)  # the same path, fewer rows: the run must not reuse the six-row build
    rows = load_rows(DataSource(recipe=str(recipe)), "math", tmp_path / "data")
    assert [r.id for r in rows] == ["q0", "q1", "q2"]
