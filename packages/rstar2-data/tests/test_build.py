"""Recipes build end to end on local data: determinism, decontamination, errors, resumption."""

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rstar2_data import ChatExample, MathProblem
from rstar2_data.build import BuildError, Manifest, build, load_built
from rstar2_data.demo import demo_problems
from rstar2_data.recipe import RecipeError, load_recipe, parse_recipe, shipped_recipes

# The benchmark copies live in shared/data/benchmarks beside the monorepo checkout (override
# with RSTAR2_BENCHMARK_DIR, as rstar2-eval's tests do).
BENCHMARKS = Path(
    os.environ.get(
        "RSTAR2_BENCHMARK_DIR",
        Path(__file__).resolve().parents[3].parent / "shared" / "data" / "benchmarks",
    )
)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_demo_recipe_writes_identical_bytes_twice(tmp_path: Path) -> None:
    recipe = load_recipe("demo")
    first = build(recipe, tmp_path / "a", progress=False)
    second = build(recipe, tmp_path / "b", progress=False)
    for name in ("data.jsonl", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert first == second
    rows = load_built(tmp_path / "a")
    assert len(rows) == first.rows > 1900
    assert all(isinstance(r, MathProblem) and r.answer_kind == "integer" for r in rows)
    other = build(recipe.model_copy(update={"seed": 1}), tmp_path / "c", progress=False)
    assert other.content_sha256 != first.content_sha256


def test_demo_sft_recipe_builds_transcripts(tmp_path: Path) -> None:
    manifest = build(load_recipe("demo-sft"), tmp_path, progress=False)
    rows = load_built(tmp_path)
    assert manifest.kind == "chat"
    assert all(isinstance(r, ChatExample) for r in rows)
    failing = [r for r in rows if isinstance(r, ChatExample) and len(r.messages) == 6]
    assert 0.2 < len(failing) / len(rows) < 0.3
    # Half the level-1 transcripts without a failure answer without the tool (recipe's
    # direct_share): about an eighth of all with levels 1 and 2.
    direct = [r for r in rows if isinstance(r, ChatExample) and len(r.messages) == 2]
    assert 0.1 < len(direct) / len(rows) < 0.3


def test_demo_training_and_heldout_recipes_share_no_problem(tmp_path: Path) -> None:
    build(load_recipe("demo"), tmp_path / "train", progress=False)
    build(load_recipe("demo-heldout"), tmp_path / "heldout", progress=False)
    train = [r for r in load_built(tmp_path / "train") if isinstance(r, MathProblem)]
    heldout = [r for r in load_built(tmp_path / "heldout") if isinstance(r, MathProblem)]
    assert 180 < len(heldout) <= 200  # dedup drops repeats of the small level-1 spaces
    assert {r.problem for r in train}.isdisjoint({r.problem for r in heldout})
    assert {r.metadata["family"] for r in heldout} == {r.metadata["family"] for r in train}


def bench_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (BENCHMARKS / name).read_text().splitlines()]


@pytest.mark.skipif(
    not (BENCHMARKS / "aime24.jsonl").is_file(),
    reason=f"benchmark files not found under {BENCHMARKS}",
)
def test_decontamination_against_shared_aime_and_math500(tmp_path: Path) -> None:
    aime, math500 = bench_rows("aime24.jsonl"), bench_rows("math500.jsonl")
    planted = [
        {"problem": aime[3]["problem"], "answer": aime[3]["answer"], "id": "copy-aime"},
        # Lightly reformatted: no $, other spacing and case, a different lead-in.
        {
            "problem": "Problem 7. "
            + aime[10]["problem"].replace("$", "").replace(", ", " , ").lower(),
            "answer": "1",
            "id": "reformatted-aime",
        },
        {
            "problem": "  " + math500[42]["problem"].replace("\\", "\\ ").upper() + "  ",
            "answer": "2",
            "id": "reformatted-math500",
        },
    ]
    clean = [
        {"problem": p.problem, "answer": p.answer, "id": p.id} for p in demo_problems(200, seed=5)
    ]
    clean += [
        {
            "problem": "A bag has 3 red and 5 blue marbles. Two are drawn without replacement. "
            "What is the probability both are red, times 56?",
            "answer": "6",
            "id": "marbles",
        },
        {
            "problem": "How many ordered pairs of positive integers (a, b) satisfy a + b = 30?",
            "answer": "29",
            "id": "pairs",
        },
    ]
    data = write_jsonl(tmp_path / "train.jsonl", planted + clean)
    path = recipe_file(
        tmp_path,
        f"""
name: decontam
kind: math
sources:
  - name: local
    path: {data.name}
    fields: {{problem: problem, answer: answer, id: id}}
filters:
  - type: decontaminate
    benchmarks:
      - {{name: aime24, path: {BENCHMARKS / "aime24.jsonl"}}}
      - {{name: aime25, path: {BENCHMARKS / "aime25.jsonl"}}}
      - {{name: math500, path: {BENCHMARKS / "math500.jsonl"}}}
output: {{shuffle: false}}
""",
    )
    manifest = build(load_recipe(path), tmp_path / "out", progress=False)
    kept = {r.id for r in load_built(tmp_path / "out")}
    assert kept == {row["id"] for row in clean}
    (report,) = manifest.filters
    assert report.removed == {"overlaps aime24 (8-grams)": 2, "overlaps math500 (8-grams)": 1}


def test_sources_counts_filters_and_malformed_rows(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"q": "What is 6 times 7?", "a": "042"},
            {"q": "What is 6 times 7?", "a": "42"},
            {"q": "Simplify x/x.", "a": "1.0"},
            {"q": "Half of one?", "a": "\\frac{1}{2}"},
            {"q": "", "a": "3"},
            {"a": "3"},
        ],
    )
    write_jsonl(
        tmp_path / "graded.jsonl",
        [
            {"problem_id": "a-0", "sample_index": i, "answer": "42", "correct": True}
            for i in range(4)
        ]
        + [
            {"problem_id": "a-2", "sample_index": i, "answer": "1", "correct": i == 0}
            for i in range(4)
        ],
    )
    path = recipe_file(
        tmp_path,
        """
name: local
kind: math
seed: 3
sources:
  - name: a
    path: a.jsonl
    fields: {problem: q, answer: a}
filters:
  - type: integer_answer
  - type: dedup
  - type: difficulty
    samples: [graded.jsonl]
output: {format: parquet}
""",
    )
    manifest = build(load_recipe(path), tmp_path / "out", progress=False)
    (source,) = manifest.sources
    assert (source.rows_read, source.converted) == (6, 4)
    assert source.malformed == {"empty field q": 1, "missing field q": 1}
    assert [f.removed for f in manifest.filters] == [
        {"answer is not an integer": 1},
        {"duplicate (normalized)": 1},
        {"solved by every sample": 1},
    ]
    rows = load_built(tmp_path / "out")
    assert [(r.id, r.answer) for r in rows] == [("a-2", "1")]
    assert (tmp_path / "out" / "data.parquet").is_file()
    again = build(load_recipe(path), tmp_path / "again", progress=False)
    assert again.content_sha256 == manifest.content_sha256


def test_decontamination_reads_benchmark_specs_with_field_alternatives(tmp_path: Path) -> None:
    leaked = "Find the number of ordered pairs of integers satisfying the grand equation below"
    write_jsonl(tmp_path / "bench.jsonl", [{"question": leaked}, {"problem": "Other text."}])
    (tmp_path / "bench.jsonl").write_text("\n" + (tmp_path / "bench.jsonl").read_text())
    write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"problem": leaked, "answer": "3"},
            {"problem": "Clean problem text here.", "answer": "4"},
        ],
    )
    recipe = recipe_file(
        tmp_path,
        """
name: decontam-fields
kind: math
sources: [{name: t, path: train.jsonl, fields: {}}]
filters:
  - type: decontaminate
    benchmarks:
      - {name: b, path: bench.jsonl, fields: {problem: [problem, question]}}
output: {shuffle: false}
""",
    )
    manifest = build(load_recipe(recipe), tmp_path / "out", progress=False)
    assert manifest.filters[0].removed == {"overlaps b (8-grams)": 1}
    assert [r.answer for r in load_built(tmp_path / "out")] == ["4"]
    recipe.write_text(recipe.read_text().replace("[problem, question]", "problem"))
    # The row is named by its line in the file (line 1 is blank).
    with pytest.raises(BuildError, match="benchmark b: line 2 has no string 'problem'"):
        build(load_recipe(recipe), tmp_path / "again", progress=False)
    recipe.write_text(recipe.read_text().replace("path: bench.jsonl, ", ""))
    with pytest.raises(RecipeError, match="give hub, path or both"):
        load_recipe(recipe)


def test_an_answer_too_long_for_int_builds_and_is_filtered_alone(tmp_path: Path) -> None:
    huge = "9" * 5000  # over Python's 4,300-digit int-string limit
    write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"problem": "A big one?", "answer": f"00{huge}", "id": "huge"},
            {"problem": "A small one?", "answer": "7", "id": "small"},
        ],
    )
    # The same answer as a bare JSON number, which json.loads cannot turn into an int.
    with (tmp_path / "a.jsonl").open("a") as handle:
        handle.write(f'{{"problem": "A bare one?", "answer": {huge}, "id": "bare"}}\n')
    source = """
name: huge
kind: math
sources:
  - {name: a, path: a.jsonl, fields: {id: id}}
output: {shuffle: false}
"""
    recipe = recipe_file(tmp_path, source)
    build(load_recipe(recipe), tmp_path / "kept", progress=False)
    rows = load_built(tmp_path / "kept")
    assert [(r.id, r.answer, r.answer_kind) for r in rows] == [
        ("huge", huge, "integer"),
        ("small", "7", "integer"),
        ("bare", huge, "integer"),
    ]
    recipe.write_text(source + "filters: [{type: integer_answer}]\n")
    manifest = build(load_recipe(recipe), tmp_path / "filtered", progress=False)
    assert manifest.filters[0].removed == {"answer larger than 1000000000000": 2}
    assert [r.id for r in load_built(tmp_path / "filtered")] == ["small"]


def test_count_sampling_is_seeded_and_restart_reuses_the_cache(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [{"problem": f"P{i}?", "answer": i} for i in range(50)])
    path = recipe_file(
        tmp_path,
        """
name: sampled
kind: math
sources:
  - {name: p, path: p.jsonl, fields: {}, count: 10}
""",
    )
    manifest = build(load_recipe(path), tmp_path / "out", progress=False)
    assert manifest.sources[0].taken == 10
    cached = list((tmp_path / "out" / ".cache").glob("source-p-*.jsonl"))
    assert len(cached) == 1
    # A rebuild with the same source reuses its converted rows.
    cached[0].write_bytes(cached[0].read_bytes())  # (a rewrite would not change the key)
    assert build(load_recipe(path), tmp_path / "out", progress=False) == manifest
    assert list((tmp_path / "out" / ".cache").glob("source-p-*.jsonl")) == cached


def test_a_changed_source_is_rebuilt_not_read_from_the_cache(tmp_path: Path) -> None:
    rows = [{"problem": f"Problem number {i}?", "answer": i} for i in range(40)]
    source = write_jsonl(tmp_path / "p.jsonl", rows)
    path = recipe_file(
        tmp_path, "name: shrink\nkind: math\nsources: [{name: p, path: p.jsonl, fields: {}}]\n"
    )
    first = build(load_recipe(path), tmp_path / "out", progress=False)
    assert (first.sources[0].rows_read, first.rows) == (40, 40)
    write_jsonl(source, rows[:20])  # same path, fewer rows
    second = build(load_recipe(path), tmp_path / "out", progress=False)
    assert (second.sources[0].rows_read, second.rows) == (20, 20)
    assert len(load_built(tmp_path / "out")) == 20
    # Same size, one character changed: still rebuilt.
    source.write_text(source.read_text().replace("number 7?", "number 8?"))
    third = build(load_recipe(path), tmp_path / "out", progress=False)
    assert third.content_sha256 != second.content_sha256
    # Only the current build's checkpoints stay.
    assert len(list((tmp_path / "out" / ".cache").glob("source-p-*.jsonl"))) == 1


def test_weights_share_the_total(tmp_path: Path) -> None:
    for name in ("x", "y"):
        write_jsonl(
            tmp_path / f"{name}.jsonl",
            [{"problem": f"{name} {i}", "answer": 1, "id": f"{name}{i}"} for i in range(40)],
        )
    path = recipe_file(
        tmp_path,
        """
name: weighted
kind: math
total: 20
sources:
  - {name: x, path: x.jsonl, fields: {id: id}, weight: 3}
  - {name: y, path: y.jsonl, fields: {id: id}, weight: 1}
""",
    )
    manifest: Manifest = build(load_recipe(path), tmp_path / "out", progress=False)
    assert [s.taken for s in manifest.sources] == [15, 5]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("name: r\nkind: math\nsources: []\n", "sources: List should have at least 1 item"),
        (
            "name: r\nkind: math\ncolour: red\nsources: [{name: s, synthetic: demo, demo: {n: 1}}]",
            "colour: Extra inputs are not permitted",
        ),
        (
            "name: r\nkind: math\nsources: [{name: s, path: missing.jsonl, fields: {}}]",
            "sources.0.path: Value error, path does not exist",
        ),
        (
            "name: r\nkind: math\nsources: [{name: s, hub: a/b, converter: nope}]",
            "sources.0.converter: Value error, unknown converter 'nope'",
        ),
        (
            "name: r\nkind: math\nsources: [{name: s, hub: a/b}]",
            "give exactly one of converter, fields",
        ),
        (
            "name: r\nkind: chat\nsources: [{name: s, hub: a/b, converter: dapo_raw}]",
            "yields math rows, recipe is chat",
        ),
        (
            "name: r\nkind: math\nsources: [{name: s, hub: a/b, converter: dapo_raw}]\n"
            "filters: [{type: shuffle}]",
            "filters.0: Input tag 'shuffle' found using 'type'",
        ),
        (
            "name: r\nkind: chat\nsources: [{name: s, hub: a/b, converter: xlam}]\n"
            "filters: [{type: integer_answer}]",
            "filter integer_answer applies to math recipes only",
        ),
        (
            "name: r\nkind: math\nsources: [{name: s, hub: a/b, converter: dapo_raw, weight: 1}]",
            "weighted sources need the recipe's total",
        ),
        (
            "name: r\nkind: math\nsources: [{name: s, path: ${DATA}, fields: {}}]",
            "variable ${DATA} is not set",
        ),
        ("name: [r\n", "invalid YAML"),
    ],
)
def test_recipe_errors_are_precise(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        parse_recipe(body, base_dir=tmp_path, origin="r.yaml")
    assert message in str(caught.value)


def test_shipped_recipes_validate(tmp_path: Path) -> None:
    names = set(shipped_recipes())
    assert {"demo", "demo-sft", "demo-heldout", "sft-nonreasoning", "rl-math", "rl-hard"} <= names
    for name in names - {"rl-hard"}:
        assert load_recipe(name).name == name
    problems = write_jsonl(tmp_path / "p.jsonl", [])
    graded = write_jsonl(tmp_path / "g.jsonl", [])
    hard = load_recipe("rl-hard", variables={"PROBLEMS": str(problems), "SAMPLES": str(graded)})
    assert [f.type for f in hard.filters] == ["difficulty"]
    with pytest.raises(RecipeError, match="no recipe file or shipped recipe named 'nope'"):
        load_recipe("nope")
