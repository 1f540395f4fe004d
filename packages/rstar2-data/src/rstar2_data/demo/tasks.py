"""Families of integer-answer problems that need the Python tool, with difficulty levels.

Each family draws its parameters from a seeded ``random.Random``, states the problem, computes
the answer directly, and writes the solver program (reading its numbers from stdin) that a
transcript calls the tool with.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Level = Literal[1, 2, 3]
LEVELS: tuple[Level, ...] = (1, 2, 3)


@dataclass(frozen=True)
class TaskInstance:
    """One drawn problem: its text, answer, and the program and stdin that solve it."""

    family: str
    level: Level
    problem: str
    answer: int
    code: str
    stdin: str
    plan: str  # one sentence of reasoning: how the program gets the answer


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


_MULTIPLY_CODE = "a, b = map(int, input().split())\nprint(a * b)\n"
_MULTIPLY_DIGITS = {1: 4, 2: 7, 3: 12}


def _multiply(rng: random.Random, level: Level) -> TaskInstance:
    a, b = _digits(rng, _MULTIPLY_DIGITS[level]), _digits(rng, _MULTIPLY_DIGITS[level])
    text = rng.choice(
        [
            f"Compute the product ${a} \\times {b}$.",
            f"What is {a} multiplied by {b}?",
            f"Find the exact value of ${a} \\cdot {b}$.",
        ]
    )
    return TaskInstance(
        family="multiply",
        level=level,
        problem=text,
        answer=a * b,
        code=_MULTIPLY_CODE,
        stdin=f"{a} {b}\n",
        plan="Multiplying numbers this long by hand is error-prone, so I will let Python do it.",
    )


_MODPOW_CODE = "a, b, m = map(int, input().split())\nprint(pow(a, b, m))\n"
_MODPOW_BOUNDS = {1: (100, 1_000, 1_000), 2: (10_000, 10**6, 10**6), 3: (10**9, 10**12, 10**9)}


def _modpow(rng: random.Random, level: Level) -> TaskInstance:
    a_max, b_max, m_max = _MODPOW_BOUNDS[level]
    a, b, m = rng.randint(2, a_max), rng.randint(10, b_max), rng.randint(7, m_max)
    text = rng.choice(
        [
            f"Find the remainder when ${a}^{{{b}}}$ is divided by {m}.",
            f"Compute ${a}^{{{b}}} \\bmod {m}$.",
        ]
    )
    return TaskInstance(
        family="modpow",
        level=level,
        problem=text,
        answer=pow(a, b, m),
        code=_MODPOW_CODE,
        stdin=f"{a} {b} {m}\n",
        plan="Fast modular exponentiation gives this remainder exactly; Python's pow does it.",
    )


_DIGIT_SUM_CODE = (
    "base, exponent = map(int, input().split())\n"
    "print(sum(int(digit) for digit in str(base ** exponent)))\n"
)
_DIGIT_SUM_BOUNDS = {1: (9, 20, 60), 2: (99, 50, 200), 3: (999, 200, 1000)}


def _digit_sum(rng: random.Random, level: Level) -> TaskInstance:
    base_max, e_min, e_max = _DIGIT_SUM_BOUNDS[level]
    base, exponent = rng.randint(2, base_max), rng.randint(e_min, e_max)
    text = rng.choice(
        [
            f"What is the sum of the decimal digits of ${base}^{{{exponent}}}$?",
            f"Let $N = {base}^{{{exponent}}}$. Find the sum of the digits of $N$.",
        ]
    )
    return TaskInstance(
        family="digit_sum_power",
        level=level,
        problem=text,
        answer=sum(int(d) for d in str(base**exponent)),
        code=_DIGIT_SUM_CODE,
        stdin=f"{base} {exponent}\n",
        plan="The power has too many digits to expand by hand; Python's big integers can.",
    )


_PRIMES_CODE = (
    "lo, hi = map(int, input().split())\n"
    "sieve = bytearray([1]) * (hi + 1)\n"
    "sieve[0:2] = b'\\x00\\x00'\n"
    "for p in range(2, int(hi ** 0.5) + 1):\n"
    "    if sieve[p]:\n"
    "        sieve[p * p :: p] = bytearray(len(range(p * p, hi + 1, p)))\n"
    "print(sum(sieve[lo : hi + 1]))\n"
)
_PRIMES_BOUNDS = {1: (1_000, 100, 500), 2: (20_000, 1_000, 5_000), 3: (200_000, 10_000, 50_000)}


def _count_primes(rng: random.Random, level: Level) -> TaskInstance:
    hi_max, w_min, w_max = _PRIMES_BOUNDS[level]
    width = rng.randint(w_min, w_max)
    lo = rng.randint(1, hi_max - width)
    hi = lo + width
    text = rng.choice(
        [
            f"How many prime numbers $p$ satisfy ${lo} \\le p \\le {hi}$?",
            f"Count the primes between {lo} and {hi}, inclusive.",
        ]
    )
    return TaskInstance(
        family="count_primes",
        level=level,
        problem=text,
        answer=_prime_count(lo, hi),
        code=_PRIMES_CODE,
        stdin=f"{lo} {hi}\n",
        plan="A sieve of Eratosthenes up to the upper bound counts them quickly.",
    )


def _prime_count(lo: int, hi: int) -> int:
    """Counted with a plain sieve here; the tests cross-check it against trial division."""
    is_prime = [True] * (hi + 1)
    is_prime[0:2] = [False, False]
    for p in range(2, int(hi**0.5) + 1):
        if is_prime[p]:
            for multiple in range(p * p, hi + 1, p):
                is_prime[multiple] = False
    return sum(is_prime[lo:])


FAMILIES: dict[str, Callable[[random.Random, Level], TaskInstance]] = {
    "multiply": _multiply,
    "modpow": _modpow,
    "digit_sum_power": _digit_sum,
    "count_primes": _count_primes,
}
