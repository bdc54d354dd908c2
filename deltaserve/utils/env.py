"""Environment switches: a variable that must hold one of a few named values, or an integer in a range."""

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
