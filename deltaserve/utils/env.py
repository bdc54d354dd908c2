"""Environment switches: a variable that must hold one of a few named values, an integer in a range, or a pair of
powers of two."""

from __future__ import annotations

import os


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """The value of environment variable `name` (`default` when unset); anything outside `choices` raises a
    ValueError naming the variable, the allowed values and what was found."""
    value = os.environ.get(name, default)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"{name} must be {allowed}, found {value!r}")
    return value


def env_int(name: str, default: int, low: int = 0, high: int | None = None) -> int:
    """The integer value of environment variable `name` (`default` when unset or empty); a value that is not an
    integer in [low, high] raises a ValueError naming the variable, the range and what was found."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, found {raw!r}")
    return value


def pow2_pair(name: str, value: str, what: str, highs: tuple[int, int] | None = None) -> tuple[int, int]:
    """The pair "a,b" of powers of two in `value` (environment variable `name`'s, read by the caller), each at most
    its bound in `highs` when given; anything else raises a ValueError naming the variable, the form `what` (e.g.
    'be,warps'), the bounds and what was found."""
    parts = value.split(",")
    ok = len(parts) == 2 and all(p.isdigit() and int(p) >= 1 and int(p) & (int(p) - 1) == 0 for p in parts)
    if ok and highs is not None:
        ok = all(int(p) <= h for p, h in zip(parts, highs))
    if not ok:
        bounds = "" if highs is None else "".join(f", {n} <= {h}" for n, h in zip(what.split(","), highs))
        raise ValueError(f"{name}={value!r}: expected '{what}', powers of two{bounds}")
    return int(parts[0]), int(parts[1])
