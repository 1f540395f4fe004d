"""Grading throughput of rstar2-eval: integer answers (fast path) and LaTeX answers (workers).

Run by ``bench.py`` (``uv run python packages/rstar2-eval/bench/bench.py grading``). Integer
items are full responses (a few KB of reasoning, then ``<answer>\\boxed{N}</answer>``) graded end
to end, extraction included. LaTeX items are the MATH-500 answers that are not integers, graded
against their golds (half right, half wrong); every (answer, gold) pair is distinct so the
per-batch de-duplication does not flatter the figure.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rstar2_eval import Grader, GraderConfig, load_benchmark

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "benchmarks"
FILLER = "Let me compute this step by step with the tool. " * 1000


def integer_items(
    data_dir: Path, count: int, response_chars: int, seed: int
) -> tuple[list[str], list[str]]:
    """Responses with integer answers in varied spellings; about half are right."""
    rng = random.Random(seed)
    golds_pool = [
        p.answer for name in ("aime24", "aime25", "amc23") for p in load_benchmark(name, data_dir)
    ]
    responses, golds = [], []
    for i in range(count):
        gold = golds_pool[i % len(golds_pool)]
        value = int(gold) if rng.random() < 0.5 else int(gold) + rng.randint(1, 9)
        spelled = rng.choice([f"{value}", f"{value:03d}", f"{value:,}", f"{value}.0"])
        start = rng.randrange(0, len(FILLER) - response_chars)
        reasoning = FILLER[start : start + response_chars]
        responses.append(f"<reason>{reasoning}</reason>\n<answer>\\boxed{{{spelled}}}</answer>")
        golds.append(gold)
    return responses, golds


def latex_items(data_dir: Path, repeats: int, seed: int) -> tuple[list[str], list[str]]:
    """Non-integer MATH-500 answers: each gold, respelled, against itself and another gold.

    Respelling prefixes ``\\displaystyle`` (same meaning, different text), so neither the
    identical-text fast path nor the per-batch de-duplication decides it; repeats add spaces.
    """
    rng = random.Random(seed)
    golds = [p.answer for p in load_benchmark("math500", data_dir) if p.answer_kind != "integer"]
    answers, targets = [], []
    for repeat in range(repeats):

        def respell(text: str, depth: int = repeat + 1) -> str:
            return "\\displaystyle" + " " * depth + text

        for i, gold in enumerate(golds):
            other = golds[(i + rng.randrange(1, len(golds))) % len(golds)]
            answers += [respell(gold), respell(other)]
            targets += [gold, gold]
    return answers, targets


def grading(
    data_dir: Annotated[
        Path, typer.Option(help="Benchmark files (aime24.jsonl, ...).")
    ] = DEFAULT_DATA,
    integer_count: Annotated[
        int, typer.Option(min=1, help="Integer responses to grade.")
    ] = 100_000,
    response_chars: Annotated[
        int, typer.Option(min=100, max=40_000, help="Reasoning characters per response.")
    ] = 4_000,
    latex_repeats: Annotated[
        int, typer.Option(min=1, help="Passes over the MATH-500 LaTeX answers.")
    ] = 2,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Grading workers (default: available CPUs).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for the synthetic items.")] = 0,
    json_out: Annotated[
        Path | None, typer.Option(help="Also write the figures as JSON to this file.")
    ] = None,
) -> None:
    """Measure grading throughput (answers/s) for integer and LaTeX answers."""
    console = Console()
    config = GraderConfig(**({"workers": workers} if workers is not None else {}))
    figures: dict[str, object] = {
        "cpus": len(os.sched_getaffinity(0)),
        "workers": config.workers,
        "load_before": os.getloadavg(),
    }
    responses, golds = integer_items(data_dir, integer_count, response_chars, seed)
    with Grader(config) as grader:
        started = time.perf_counter()
        grades = grader.grade_many(responses, golds)
        elapsed = time.perf_counter() - started
        assert not grader.pool_started, "integer answers must not need the worker pool"
        assert all(g.method == "integer" for g in grades)
        integer: dict[str, Any] = {
            "items": len(grades),
            "seconds": elapsed,
            "answers_per_s": len(grades) / elapsed,
            "correct": sum(g.correct for g in grades),
        }

        answers, targets = latex_items(data_dir, latex_repeats, seed)
        started = time.perf_counter()
        grader.warm_up()
        worker_start_s = time.perf_counter() - started
        started = time.perf_counter()
        grades = grader.grade_answers(answers, targets)
        elapsed = time.perf_counter() - started
        statuses = {s: sum(g.status == s for g in grades) for s in {g.status for g in grades}}
        latex: dict[str, Any] = {
            "items": len(grades),
            "seconds": elapsed,
            "answers_per_s": len(grades) / elapsed,
            "statuses": statuses,
        }
    # CPU time per item, measured serially in this process: unlike wall-clock rates, it barely
    # moves with the load of other jobs, so it says what an idle machine would do.
    from rstar2_eval.verification import math_verify_equal

    math_verify_equal("1/2", "\\frac{1}{2}")  # import outside the measurement
    cpu_started = time.process_time()
    for answer, target in zip(answers, targets, strict=True):
        math_verify_equal(answer, target)
    latex["cpu_ms_per_item"] = 1000 * (time.process_time() - cpu_started) / len(answers)
    latex["idle_rate_estimate"] = config.workers * 1000 / latex["cpu_ms_per_item"]
    figures.update(
        integer=integer, latex=latex, worker_start_s=worker_start_s, load_after=os.getloadavg()
    )

    table = Table(title="rstar2-eval grading throughput", title_justify="left")
    for column in ("kind", "items", "seconds", "answers/s", "notes"):
        table.add_column(column, justify="left" if column in ("kind", "notes") else "right")
    table.add_row(
        "integer (fast path)",
        str(integer["items"]),
        f"{integer['seconds']:.2f}",
        f"{integer['answers_per_s']:,.0f}",
        f"{response_chars}-char responses, extraction included, no workers",
    )
    table.add_row(
        "LaTeX (math-verify)",
        str(latex["items"]),
        f"{latex['seconds']:.2f}",
        f"{latex['answers_per_s']:,.0f}",
        f"{config.workers} warm workers; statuses {latex['statuses']}; "
        f"{latex['cpu_ms_per_item']:.1f} CPU ms/item serially "
        f"(~{latex['idle_rate_estimate']:.0f}/s on {config.workers} idle cores)",
    )
    console.print(table)
    console.print(
        f"cpus={figures['cpus']} worker start={worker_start_s:.1f}s "
        f"load before={figures['load_before']} after={figures['load_after']}",
        highlight=False,
    )
    if json_out is not None:
        json_out.write_text(json.dumps(figures, indent=2) + "\n")
