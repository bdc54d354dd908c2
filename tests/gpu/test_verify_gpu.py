"""Speculative verification on CUDA, end to end through the model: a verify forward's logits == the decode steps'
bit for bit, and its commit == decoding the kept rows (verify_helpers.check_verify_equals_decode), on the tiny bf16
model's fast path, on the q4 g64 model in every tensor-core / CUDA-core mode of test_model_mma_path, and on the
q4 model whose DeltaNet step writes its out projection's prep.

Run on the H200: `pytest -m gpu tests/gpu/test_verify_gpu.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from test_model_fast_path import models as bf16_models  # noqa: F401  (fixtures)
from test_model_mma_path import _without_modes, models, prep_model  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent.parent))
from verify_helpers import check_verify_equals_decode  # noqa: E402

pytestmark = pytest.mark.gpu


def test_verify_bf16_fast_path(bf16_models):
    check_verify_equals_decode(bf16_models[1], torch.bfloat16, "cuda", reference_prefill=False)


def test_verify_q4_modes(models):
    check_verify_equals_decode(models[1], torch.bfloat16, "cuda", reference_prefill=False)


def test_verify_q4_with_the_step_prep(prep_model, monkeypatch):
    _without_modes(monkeypatch)
    check_verify_equals_decode(prep_model, torch.bfloat16, "cuda", reference_prefill=False)


@pytest.mark.parametrize("deployment", ["head", "mma"])
def test_verify_in_each_deployment(models, deployment):
    """The deployment fixes the step shape, the merge shape and the GEMV family (fast.set_decode_gemv): the verify
    follows each."""
    from deltaserve.model import fast

    fast.set_decode_gemv(models[1], deployment)
    try:
        check_verify_equals_decode(models[1], torch.bfloat16, "cuda", reference_prefill=False)
    finally:
        fast.set_decode_gemv(models[1], "head")
