"""Every environment variable deltaserve reads, declared once: name, type, default, one line of documentation.

Nothing else in the package reads `os.environ` (tests/test_tuning.py greps for it). Deployment choices are not
here: they are `EngineConfig` / `LLM(...)` arguments and CLI flags (decode_gemv, moe_kernels, kv_cache_dtype, ...).
What is left is a debugging switch, where files go, and the experiments not yet measured in the model (each says
so; once one is measured, the loser's code goes and so does its variable). docs/tuning.md is generated from this
table: `python -m deltaserve.utils.tuning > docs/tuning.md` (a test checks it is current).

A value is read when asked for (`get`), not at import: tests set variables per test, and a device call sets them
per run. A bad value raises a ValueError naming the variable, what it accepts and what was found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Var:
    name: str
    kind: str  # "bool" | "str" | "int" | "choice"
    default: object
    doc: str
    choices: tuple[str, ...] = ()
    low: int = 0
    high: int | None = None
    parse: Callable[[str], object] | None = None  # "str" values with a form of their own (checked when read)

    def read(self, raw: str | None):
        if raw is None or not raw.strip():
            return self.default
        raw = raw.strip()
        if self.kind == "bool":
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{self.name} must be 0 or 1, found {raw!r}")
        if self.kind == "choice":
            if raw not in self.choices:
                allowed = ", ".join(repr(c) for c in self.choices[:-1]) + f" or {self.choices[-1]!r}"
                raise ValueError(f"{self.name} must be {allowed}, found {raw!r}")
            return raw
        if self.kind == "int":
            try:
                value = int(raw)
            except ValueError:
                value = None
            if value is None or value < self.low or (self.high is not None and value > self.high):
                bound = f"an integer >= {self.low}" if self.high is None else f"an integer in [{self.low}, {self.high}]"
                raise ValueError(f"{self.name} must be {bound}, found {raw!r}")
            return value
        return self.parse(raw) if self.parse is not None else raw


def _long_split(raw: str):
    """'off' or 'FROMxTILES' (checked against the kernel's bounds where it is used: triton_paged.long_split)."""
    if raw == "off":
        return None
    first, _, tiles = raw.partition("x")
    try:
        return int(first), int(tiles)
    except ValueError:
        raise ValueError(f"DELTASERVE_ATTN_LONG_SPLIT must be off or FROMxTILES (e.g. 8192x2), found {raw!r}") from None


VARIABLES: tuple[Var, ...] = (
    # -- where things go, what a record says
    Var("DELTASERVE_CACHE", "str", "",
        "Folder of the built-in tiny checkpoint that `deltaserve run` makes on first use (default "
        "~/.cache/deltaserve)."),
    Var("DELTASERVE_COMMIT", "str", "",
        "The commit a bench record names, where the tree has no .git (a copy on the GPU machine); default: "
        "`git rev-parse --short HEAD`."),
    # -- debugging
    Var("DELTASERVE_REFERENCE", "bool", False,
        "1: run the pure-PyTorch reference ops on the GPU too (no Triton kernel; kernels.use_reference(True) "
        "in code)."),
    Var("DELTASERVE_FAST_INTERPRET", "bool", False,
        "1 with TRITON_INTERPRET=1: run the GPU fast path on CPU in Triton's interpreter (the CPU tests of the "
        "fast path; slow)."),
    Var("DELTASERVE_PDL", "bool", True,
        "0: launch the decode kernels without programmatic dependent launch (fully serialised; the same bits), "
        "to tell an overlap bug from a kernel bug."),
    Var("TRITON_INTERPRET", "bool", False,
        "Triton's own switch (read here, not set): 1 runs every Triton kernel in the interpreter on CPU."),
    # -- experiments prepared and checked for bits, not yet measured in the model (lab/NOTES.md)
    Var("DELTASERVE_ATTN_LONG_SPLIT", "str", "auto",
        "Decode attention: rows longer than FROM tokens take splits of TILES x 64 tokens (FROMxTILES), 'off', or "
        "'auto' (triton_paged.LONG_SPLIT: off). A row's bits depend on its own length and this, never on the batch.",
        parse=lambda raw: "auto" if raw == "auto" else _long_split(raw)),
    Var("DELTASERVE_WGMMA_SPLIT_WAIT", "bool", False,
        "1: the warpgroup-MMA experts kernel's gated step waits for gate's MMAs alone first and makes gate's FMAs "
        "while up's run (the same bits; -1% for the launch in a probe, not yet measured in the model)."),
    Var("DELTASERVE_ROUTER_ROW_BLOCKS", "int", 1,
        "Row blocks a program of the many-token router GEMV (a power of two up to 64; the same bits).",
        low=1, high=64),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def get(name: str):
    """The typed value of declared variable `name` (its default when unset or empty)."""
    var = _BY_NAME.get(name)
    if var is None:
        raise KeyError(f"{name} is not a declared deltaserve variable (deltaserve/utils/tuning.py)")
    return var.read(os.environ.get(name))


def interpreting() -> bool:
    """Whether Triton runs its kernels in the interpreter (TRITON_INTERPRET set and not 0)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def set_in_environment() -> dict[str, str]:
    """The declared deltaserve variables set in this process's environment (for a record's notes), by name."""
    return {v.name: os.environ[v.name] for v in VARIABLES
            if v.name.startswith("DELTASERVE_") and v.name != "DELTASERVE_COMMIT" and os.environ.get(v.name)}


def markdown() -> str:
    """docs/tuning.md: one row per variable."""
    lines = [
        "# Environment variables",
        "",
        "Generated from `deltaserve/utils/tuning.py` (`python -m deltaserve.utils.tuning > docs/tuning.md`); do not",
        "edit by hand. Deployment choices are not environment variables: they are `LLM(...)` / `EngineConfig`",
        "arguments and CLI flags (see docs/performance.md).",
        "",
        "| variable | type | default | what it does |",
        "|---|---|---|---|",
    ]
    for v in VARIABLES:
        kind = " / ".join(v.choices) if v.kind == "choice" else v.kind
        default = {True: "1", False: "0"}.get(v.default, v.default) if v.kind == "bool" else v.default
        lines.append(f"| `{v.name}` | {kind} | `{default}` | {v.doc} |".replace("``", "(unset)"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
