"""Precision and recall of the ``decontaminate`` filter, measured on planted edits and real
problems.

Recall: every problem of the target benchmarks (AIME24, AIME25, MATH-500) is planted in each of
the edited forms of ``planted.py`` (a sentence before, a sentence after, other LaTeX spellings,
one word changed; numbers unchanged) and verbatim; the caught fraction is reported per edit and
for short problems (fewer than 24 canonical words, the filter's ``short_words``). Each short
problem is also planted in the ``SHORT_EDITS`` forms (one number changed, the last clause
dropped), reported apart per benchmark. False flags: the fraction flagged of real problems
that are not in the targets (AMC23, 40 problems) and of ordinary synthetic problems
(``synth.py``, which carry stock phrases such as "m and n are relatively prime positive
integers"). With ``--leave-one-out``, each of those real problems is also checked against a
filter built from all the others. Prints a JSON report on stdout.

    python packages/rstar2-data/bench/decontam.py [--leave-one-out]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from planted import EDITS, SHORT_EDITS, benchmark_problems
from synth import problem_text

from rstar2_data import MathProblem
from rstar2_data.filters import Decontaminate, Item, canonical_words, normalize_words

TARGETS = ("aime24", "aime25", "math500")
SHORT = 24


def _item(text: str) -> Item:
    return Item(
        MathProblem(id="x", source="bench", problem=text, answer="0", answer_kind="integer")
    )


def measure(benchmarks: Path, *, seed: int, ordinary: int) -> dict[str, object]:
    targets = benchmark_problems(benchmarks, TARGETS)
    texts: dict[str, list[str]] = {}
    for name, text in targets:
        texts.setdefault(name, []).append(text)
    started = time.perf_counter()
    decontam = Decontaminate(texts)
    index_s = time.perf_counter() - started
    rng = random.Random(seed)
    planted: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    missed: list[dict[str, str]] = []
    edits = {"verbatim": lambda text, rng: text, **EDITS}
    for name, text in targets:
        short = len(canonical_words(normalize_words(text))) < SHORT
        for edit, function in {**edits, **(SHORT_EDITS if short else {})}.items():
            edited = function(text, rng)
            if edited is None:
                continue
            hit = decontam.check(_item(edited)) is not None
            if edit in SHORT_EDITS:
                groups: tuple[str, ...] = (f"{edit} (short {name} problems)",)
            else:
                groups = (edit, "all", *(["short problems"] if short else []))
            for group in groups:
                planted[group] += 1
                caught[group] += hit
            if not hit:
                missed.append({"benchmark": name, "edit": edit, "text": edited})
    amc = benchmark_problems(benchmarks, ("amc23",))
    amc_flags = [
        {"problem": text[:100], "reason": reason}
        for _, text in amc
        if (reason := decontam.check(_item(text))) is not None
    ]
    synthetic = [problem_text(rng) for _ in range(ordinary)]
    started = time.perf_counter()
    synthetic_flags = Counter(
        reason for text in synthetic if (reason := decontam.check(_item(text))) is not None
    )
    check_s = time.perf_counter() - started
    return {
        "caught": {
            group: f"{caught[group]}/{planted[group]} ({caught[group] / planted[group]:.2%})"
            for group in planted
        },
        "missed": missed,
        "amc23_flagged": f"{len(amc_flags)}/{len(amc)}",
        "amc23_flags": amc_flags,
        "synthetic_flagged": f"{sum(synthetic_flags.values())}/{ordinary}",
        "synthetic_flags": dict(synthetic_flags),
        "index_seconds": round(index_s, 2),
        "check_us_per_row": round(check_s / max(1, ordinary) * 1e6, 1),
    }


def leave_one_out(benchmarks: Path) -> dict[str, object]:
    """Each real problem (targets and AMC23) checked against a filter built from all the others:
    how often distinct real problems, phrased alike, are taken for copies of each other."""
    problems = benchmark_problems(benchmarks, (*TARGETS, "amc23"))
    flags = []
    for number, (name, text) in enumerate(problems):
        others: dict[str, list[str]] = {}
        for other, (benchmark, problem) in enumerate(problems):
            if other != number:
                others.setdefault(benchmark, []).append(problem)
        if (reason := Decontaminate(others).check(_item(text))) is not None:
            flags.append({"benchmark": name, "problem": text[:100], "reason": reason})
    return {"leave_one_out_flagged": f"{len(flags)}/{len(problems)}", "leave_one_out_flags": flags}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--benchmarks",
        type=Path,
        default=Path(__file__).resolve().parents[3].parent / "shared" / "data" / "benchmarks",
        help="folder with aime24.jsonl, aime25.jsonl, math500.jsonl and amc23.jsonl",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the edits")
    parser.add_argument(
        "--ordinary", type=int, default=20_000, help="synthetic ordinary problems to check"
    )
    parser.add_argument(
        "--leave-one-out",
        action="store_true",
        help="also check each real problem against a filter built from the others (about 30 s)",
    )
    args = parser.parse_args()
    report = measure(args.benchmarks, seed=args.seed, ordinary=args.ordinary)
    if args.leave_one_out:
        report.update(leave_one_out(args.benchmarks))
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
