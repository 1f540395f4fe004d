"""A synthetic math corpus of any size, for scale benchmarks of ``rstar2-data build``.

Rows are JSON objects ``{"uid", "question", "final_answer"}`` (read through a recipe's
``fields:`` mapping). Problems are 300-800 characters of templated competition-style text with
random names and numbers; about 5% have a fraction as answer (``integer_answer`` removes
them), 2% repeat an earlier problem (reformatted: case and spacing), 0.5% are benchmark
problems (AIME24/25, MATH-500) verbatim or with one of the planted edits of ``planted.py``
(marked ``"planted": "<benchmark>/<edit>"``, a field recipes do not map), and 1% carry the
stock phrase "m and n are relatively prime positive integers" that real problems
share with benchmarks. Same arguments, same bytes.

    python packages/rstar2-data/bench/synth.py --rows 1000000 --out /tmp/synth.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from planted import EDITS, benchmark_problems

EDIT_NAMES = {function: name for name, function in EDITS.items()}

NAMES = ("Alice", "Bob", "Carmen", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas")
THINGS = ("marbles", "coins", "tiles", "stamps", "cards", "beads", "tokens", "pebbles")
SENTENCES = (
    "{name} has {a} {thing} and gives away {b} of them each day for {c} days.",
    "A sequence satisfies $u_1 = {a}$ and $u_{{k+1}} = {b} u_k + {c}$ for every $k \\ge 1$.",
    "Let $p(x) = {a}x^3 - {b}x + {c}$ be a cubic with real coefficients.",
    "A box holds {a} red and {b} blue {thing}; {c} of them are drawn at random.",
    "The rectangle $WXYZ$ has side lengths ${a}$ and ${b}$, and a point lies {c} units from $W$.",
    "In a club of {a} members, {b} play chess and {c} play go.",
    "Consider all ordered triples $(r, s, t)$ of integers with $r + s + t = {a}$ and "
    "$0 \\le r \\le {b}$.",
    "A train leaves at {a} km/h and a second one follows {b} minutes later at {c} km/h.",
    "The digits of a {a}-digit code are chosen so that no two adjacent digits differ by {b}.",
    "{name} writes the integers from {a} to {b} on a board and erases every multiple of {c}.",
    "A fair die is rolled {a} times and the faces are recorded in order.",
    "Let $T$ be the set of lattice points inside the circle $x^2 + y^2 = {a}$.",
)
QUESTIONS = (
    "What is the remainder when the result is divided by {m}?",
    "How many such choices are possible?",
    "Find the least value of the expression over all valid choices.",
    "Compute the sum of all possible values.",
    "How many {thing} remain at the end?",
)
STOCK = (
    "The probability can be written as $\\frac{{m}}{{n}}$, where m and n are relatively prime "
    "positive integers. Find m+n."
)


def problem_text(rng: random.Random) -> str:
    """Sentences until the text is about 300-800 characters, then a question."""
    length = rng.randint(400, 800)
    tail = STOCK if rng.random() < 0.01 else rng.choice(QUESTIONS)
    tail = tail.format(m=rng.randint(3, 97), thing=rng.choice(THINGS))
    parts: list[str] = []
    size = len(tail)
    while True:
        sentence = rng.choice(SENTENCES).format(
            name=rng.choice(NAMES),
            thing=rng.choice(THINGS),
            a=rng.randint(2, 999),
            b=rng.randint(2, 999),
            c=rng.randint(2, 99),
        )
        if size + len(sentence) + 1 > length:
            break
        parts.append(sentence)
        size += len(sentence) + 1
    parts.append(tail)
    return " ".join(parts)


def reformat(text: str, rng: random.Random) -> str:
    """The same problem as another dataset writes it: other case and spacing."""
    return text.upper() if rng.random() < 0.5 else "  " + text.replace(" ", "  ") + " "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows to write")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument(
        "--benchmarks",
        type=Path,
        default=Path(__file__).resolve().parents[3].parent / "shared" / "data" / "benchmarks",
        help="folder with aime24.jsonl, aime25.jsonl, math500.jsonl",
    )
    args = parser.parse_args()
    write(args.out, rows=args.rows, seed=args.seed, benchmarks=args.benchmarks)
    print(f"wrote {args.rows} rows to {args.out}", file=sys.stderr)


def write(out: Path, *, rows: int, seed: int, benchmarks: Path) -> None:
    """Write ``rows`` synthetic rows to ``out`` (see the module's docstring)."""
    rng = random.Random(seed)
    bench = benchmark_problems(benchmarks, ("aime24", "aime25", "math500"))
    edits = [None, *EDITS.values()]
    recent: list[str] = []
    with out.open("w", encoding="utf-8") as handle:
        for index in range(rows):
            draw = rng.random()
            planted = None
            if draw < 0.005:
                name, text = rng.choice(bench)
                edit = rng.choice(edits)
                edited = edit(text, rng) if edit is not None else None
                text = edited or text
                planted = f"{name}/{EDIT_NAMES[edit] if edited else 'verbatim'}"
            elif draw < 0.025 and recent:
                text = reformat(rng.choice(recent), rng)
            else:
                text = problem_text(rng)
                recent.append(text)
                if len(recent) > 10_000:
                    recent[rng.randrange(len(recent))] = recent.pop()
            answer: str | int = rng.randint(0, 10**6)
            if rng.random() < 0.05:
                answer = f"\\frac{{{rng.randint(1, 50)}}}{{{rng.randint(51, 99)}}}"
            row: dict[str, object] = {
                "uid": f"synth-{index}",
                "question": text,
                "final_answer": answer,
            }
            if planted is not None:
                row["planted"] = planted  # not mapped by the recipe: ground truth for reports
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
