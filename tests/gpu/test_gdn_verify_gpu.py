"""Speculative verification's DeltaNet kernels on CUDA at the Qwen3.6-35B-A3B shapes (Hk 16, Hv 32, dk = dv = 128,
conv 8192 x 4), in every step shape a deployment may fix (32 and 64 state columns a program, a head a program),
with and without the out projection's q4 prep: rows of a verify == the decode step token after token, bit for bit;
commits == decoding the kept rows (verify_cases.py; the same cases run under the interpreter in CI)."""

from __future__ import annotations

import importlib

import pytest

import verify_cases as vc

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mods(dev):
    return {key: importlib.import_module(f"deltaserve.kernels.{path}") for key, path in (
        ("gdn", "gated_delta.triton_decode"), ("verify", "gated_delta.triton_verify"))}


def shapes(small):
    return dict(hk=2, hv=4, dk=16, dv=32) if small else dict(hk=16, hv=32, dk=128, dv=128)


@pytest.mark.parametrize("dv_block", [32, 64, None])
@pytest.mark.parametrize("prep", [None, (4, 64)])
@pytest.mark.parametrize("seqs", [[4], [2, 1, 4, 3], [4] * 16 + [1] * 8])
def test_verify_step_equals_decode_steps(mods, dev, small, dv_block, prep, seqs):
    sh = shapes(small)
    if small:
        dv_block, prep = (16 if dv_block else None), (prep and (4, 32))
    vc.check_verify_step(mods, dev, seqs, dv_block=dv_block, prep=prep, **sh)


@pytest.mark.parametrize("seqs", [[4], [2, 1, 4, 3], [5] * 64])
def test_conv_verify_equals_decode_conv(mods, dev, small, seqs):
    vc.check_conv_verify(mods, dev, 40 if small else 8192, 4, seqs)
