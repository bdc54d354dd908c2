"""GPU tests: marked `gpu` (deselected by default; run with `pytest -m gpu tests/gpu`) and skipped without CUDA.

A dry run on CPU through Triton's interpreter (TRITON_INTERPRET=1 set before Python starts) runs the same tests at
toy sizes, to catch mistakes before spending device time: `TRITON_INTERPRET=1 pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@pytest.fixture(scope="session")
def dev() -> str:
    pytest.importorskip("triton", reason="the GPU tests need Triton")
    if INTERPRET:
        if "triton" in sys.modules and not _triton_interpreted():
            pytest.skip("Triton was imported before TRITON_INTERPRET was set")
        from kernel_cases import interpreter_numpy_shim

        interpreter_numpy_shim()
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return "cuda"


def _triton_interpreted() -> bool:
    import triton.language as tl

    return type(tl.zeros).__name__ == "InterpretedFunction"


@pytest.fixture(scope="session")
def bf16_moe_checkpoint(tmp_path_factory):
    """A tiny MoE checkpoint with bf16-exact weights (model_helpers.bf16_exact_moe_checkpoint), written once."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from model_helpers import bf16_exact_moe_checkpoint

    d = tmp_path_factory.mktemp("bf16_moe")
    bf16_exact_moe_checkpoint(d)
    return d


@pytest.fixture(scope="module")
def bf16_moe_model(bf16_moe_checkpoint):
    """That checkpoint loaded in bf16 on the GPU: the fast path."""
    from deltaserve.weights.loader import load_checkpoint

    return load_checkpoint(bf16_moe_checkpoint, device="cuda", dtype=torch.bfloat16, progress=False).model


@pytest.fixture(scope="session")
def small() -> bool:
    """True in the interpreter dry run: tests shrink their problems to toy sizes."""
    return INTERPRET


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
