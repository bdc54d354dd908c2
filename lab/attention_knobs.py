"""The decode attention's launch knobs by the names the lab's sweeps and probes use (SPLIT_TOKENS, DECODE_BN,
DECODE_WARPS / DECODE_STAGES as {cache kind: value}, MERGE_BSP, MERGE_BD, LONG_BN, and triton_paged's experiment
hooks DECODE_PROGRAMS, LONG_SPLIT, LONG_STAGES), read from and set on the library: the tuned ones live in the launch
table (deltaserve/kernels/launch_table.py, "attention.*"), the experiments are triton_paged module values.

  get(name)            the library's value now
  check(names)         a KeyError naming the first unknown knob (applied() checks every name before it sets any)
  applied({name: v})   a context manager that sets them for its block (table overrides and module values alike)
"""

from __future__ import annotations

import contextlib

from deltaserve.kernels import launch_table
from deltaserve.kernels.attention import triton_paged as tp

TABLE = {"SPLIT_TOKENS": "attention.split_tokens", "DECODE_BN": "attention.decode_bn",
         "MERGE_BSP": "attention.merge_bsp", "MERGE_BD": "attention.merge_bd", "LONG_BN": "attention.long_bn"}
PER_KIND = {"DECODE_WARPS": "attention.decode_warps_{}", "DECODE_STAGES": "attention.decode_stages_{}"}
KINDS = ("bf16", "fp8")
HOOKS = ("DECODE_PROGRAMS", "LONG_SPLIT", "LONG_STAGES")
NAMES = (*TABLE, *PER_KIND, *HOOKS)


def check(names) -> None:
    for name in names:
        if name not in NAMES:
            raise KeyError(f"no decode attention knob {name!r} (one of {', '.join(NAMES)})")


def get(name: str):
    check([name])
    if name in TABLE:
        return launch_table.value(TABLE[name])
    if name in PER_KIND:
        return {k: launch_table.value(PER_KIND[name].format(k)) for k in KINDS}
    return getattr(tp, name)


@contextlib.contextmanager
def applied(values: dict):
    """Set the knobs `values` for the block. A per-kind knob given as a dict sets the kinds it names (a kind left
    out gets null: Triton's default for stages, 4 warps)."""
    check(values)
    table, hooks = {}, {}
    for name, v in values.items():
        if name in TABLE:
            table[TABLE[name]] = v
        elif name in PER_KIND:
            fill = 4 if name == "DECODE_WARPS" else None
            table.update({PER_KIND[name].format(k): (v or {}).get(k, fill) for k in KINDS})
        else:
            hooks[name] = v
    saved = {n: getattr(tp, n) for n in hooks}
    try:
        for n, v in hooks.items():
            setattr(tp, n, v)
        with launch_table.override(table):
            yield
    finally:
        for n, v in saved.items():
            setattr(tp, n, v)
