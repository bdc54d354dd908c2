"""Environment switches: a variable that must hold one of a few named values."""

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
