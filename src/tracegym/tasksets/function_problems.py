"""Function problems: the kinds of function python-functions asks for, each with a reference solution (run here,
never shown) and a generator of arguments, from which a seeded problem with hidden tests is drawn."""

from __future__ import annotations

import json
import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from pydantic import BaseModel

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "quiet", "brave", "ocean", "piano", "maple", "zebra",
         "ember", "delta", "frost", "grape", "honey", "ivory", "jolly", "karma", "a", "an", "is", "to", "of")


class FunctionTest(BaseModel):
    """One call and the value it must return (both as JSON reads them: tuples become lists)."""

    args: list[Any]
    expected: Any


@dataclass(frozen=True)
class Family:
    """A kind of function to write."""

    name: str
    signature: str
    """The `def` line without `def` and the colon: `sum_digits(n: int) -> int`."""
    description: str
    """What it returns, completing 'that returns ...'."""
    reference: Callable[..., Any]
    arguments: Callable[[random.Random], tuple[Any, ...]]

    def test(self, rng: random.Random) -> FunctionTest:
        """A fresh call and its expected value, both through JSON so they compare with what a program prints."""
        args = self.arguments(rng)
        return FunctionTest.model_validate(json.loads(json.dumps({"args": args, "expected": self.reference(*args)})))


def _ints(rng: random.Random, low: int = -50, high: int = 50, size: tuple[int, int] = (0, 12)) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(*size))]


def _sentence(rng: random.Random, size: tuple[int, int] = (1, 7)) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(*size)))


def _palindrome_candidate(rng: random.Random) -> tuple[str]:
    half = "".join(rng.choice("abcde") for _ in range(rng.randint(1, 5)))
    text = half + half[::-1] if rng.random() < 0.5 else half + rng.choice("xyz") + half
    return ("".join(c.upper() if rng.random() < 0.3 else c for c in text) + rng.choice(["", "!", " ?"]),)


def _is_palindrome(s: str) -> bool:
    letters = [c.lower() for c in s if c.isalpha()]
    return letters == letters[::-1]


def _fizzbuzz(n: int) -> str:
    return "FizzBuzz" if n % 15 == 0 else "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n)


def _second_largest(xs: list[int]) -> int:
    return sorted(set(xs))[-2]


def _distinct_pair_list(rng: random.Random) -> tuple[list[int]]:
    xs = _ints(rng, size=(2, 10))
    return (xs if len(set(xs)) >= 2 else [*xs, max(xs) + 1],)


def _rotate_left(xs: list[int], k: int) -> list[int]:
    return xs[k % len(xs):] + xs[:k % len(xs)] if xs else []


def _caesar(s: str, k: int) -> str:
    return "".join(chr((ord(c) - 97 + k) % 26 + 97) if c in string.ascii_lowercase else c for c in s)


def _run_length(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}")
        i = j
    return "".join(out)


def _count_primes(n: int) -> int:
    return sum(k >= 2 and all(k % d for d in range(2, math.isqrt(k) + 1)) for k in range(n + 1))


def _max_profit(prices: list[int]) -> int:
    best, low = 0.0, math.inf
    for price in prices:
        low = min(low, price)
        best = max(best, price - low)
    return int(best)


FAMILIES: tuple[Family, ...] = (
    Family("sum_digits", "sum_digits(n: int) -> int", "the sum of the decimal digits of the non-negative integer n",
           lambda n: sum(map(int, str(n))), lambda rng: (rng.randint(0, 10**rng.randint(1, 9)),)),
    Family("reverse_words", "reverse_words(s: str) -> str",
           "s with its space-separated words in reverse order, joined by single spaces",
           lambda s: " ".join(reversed(s.split())), lambda rng: (_sentence(rng),)),
    Family("is_palindrome", "is_palindrome(s: str) -> bool",
           "True when the letters of s, ignoring case and every non-letter, read the same backwards",
           _is_palindrome, _palindrome_candidate),
    Family("count_vowels", "count_vowels(s: str) -> int", "how many of the characters of s are one of 'aeiouAEIOU'",
           lambda s: sum(c in "aeiouAEIOU" for c in s), lambda rng: (_sentence(rng).title(),)),
    Family("fizzbuzz", "fizzbuzz(n: int) -> str",
           "'FizzBuzz' when n is a multiple of 15, 'Fizz' of 3, 'Buzz' of 5, else str(n)",
           _fizzbuzz, lambda rng: (rng.randint(1, 300),)),
    Family("gcd", "gcd(a: int, b: int) -> int", "the greatest common divisor of the positive integers a and b",
           math.gcd, lambda rng: (rng.randint(1, 60) * (k := rng.randint(1, 40)), rng.randint(1, 60) * k)),
    Family("running_sum", "running_sum(xs: list[int]) -> list[int]",
           "the list whose i-th item is the sum of xs[0] through xs[i]",
           lambda xs: list(accumulate(xs)), lambda rng: (_ints(rng),)),
    Family("second_largest", "second_largest(xs: list[int]) -> int",
           "the second largest distinct value in xs (xs holds at least two distinct values)",
           _second_largest, _distinct_pair_list),
    Family("rotate_left", "rotate_left(xs: list[int], k: int) -> list[int]",
           "xs rotated left by k places (k may exceed len(xs); an empty list stays empty)",
           _rotate_left, lambda rng: (_ints(rng), rng.randint(0, 20))),
    Family("caesar", "caesar(s: str, k: int) -> str",
           "s with every lowercase letter a-z shifted k places forward through the alphabet (wrapping from z to a) "
           "and every other character unchanged", _caesar, lambda rng: (_sentence(rng), rng.randint(0, 30))),
    Family("dedupe", "dedupe(xs: list[int]) -> list[int]",
           "xs without repeated values, keeping each value's first occurrence, in order",
           lambda xs: list(dict.fromkeys(xs)), lambda rng: (_ints(rng, -5, 5),)),
    Family("run_length", "run_length(s: str) -> str",
           "the run-length encoding of s: each run of one repeated character as the character and the run's length "
           "('aaab' gives 'a3b1'; '' gives '')",
           _run_length, lambda rng: ("".join(rng.choice("ab") * rng.randint(1, 4) for _ in range(rng.randint(0, 5))),)),
    Family("count_primes", "count_primes(n: int) -> int", "how many prime numbers are less than or equal to n",
           _count_primes, lambda rng: (rng.randint(0, 2000),)),
    Family("max_profit", "max_profit(prices: list[int]) -> int",
           "the largest prices[j] - prices[i] over i < j, or 0 when no such difference is positive",
           _max_profit, lambda rng: (_ints(rng, 1, 100),)),
    Family("count_ones", "count_ones(n: int) -> int",
           "how many 1 bits the binary form of the non-negative integer n has",
           lambda n: bin(n).count("1"), lambda rng: (rng.randint(0, 2**rng.randint(1, 40)),)),
)
"""Every kind of problem, in the order tasks cycle through them."""
