"""Which implementation of the kernels runs: the pure-PyTorch references or the Triton kernels beside them.

The references are the spec and the CPU path. The Triton kernels (`kernels/**/triton_*.py`) run only where Triton
can launch them (a CUDA device, or the Triton interpreter under TRITON_INTERPRET=1 for tests). Callers ask
`reference_enabled()`; it is True when

  - `use_reference(True)` was called (a process-wide switch, e.g. to run a whole model on references), or
  - the environment has DELTASERVE_REFERENCE=1 (read at every call, so tests may set it late), or
  - Triton is not importable.

`use_reference(None)` drops the explicit switch and goes back to the environment/availability rule. Whether a
given tensor is on a device the Triton path can serve is the caller's check (`triton_usable(tensor)`).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator

import torch

from ..utils import tuning

_forced: bool | None = None


def use_reference(flag: bool | None) -> bool | None:
    """Force the reference path on (True) or off (False), or clear the switch (None). Returns the previous switch."""
    global _forced
    if flag is not None and not isinstance(flag, bool):
        raise TypeError(f"use_reference expects True, False or None, got {flag!r}")
    previous, _forced = _forced, flag
    return previous


@contextmanager
def reference(flag: bool = True) -> Iterator[None]:
    """`with reference(): ...` runs the block with the switch set, then restores the previous switch."""
    previous = use_reference(flag)
    try:
        yield
    finally:
        use_reference(previous)


def _env_reference() -> bool:
    return tuning.get("DELTASERVE_REFERENCE")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when `import triton` works (it need not have a GPU: the interpreter counts)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install raising at import time
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return tuning.interpreting()


def reference_enabled() -> bool:
    """Should callers use the pure-PyTorch references? (see the module docstring for the rule)"""
    if _forced is not None:
        return _forced
    return _env_reference() or not triton_available()


def triton_usable(t: torch.Tensor) -> bool:
    """Can the Triton path serve a tensor on t's device? CUDA always; CPU only in the interpreter."""
    if reference_enabled():
        return False
    return t.is_cuda or (t.device.type == "cpu" and interpreting())
