"""Speculative verification's DeltaNet kernels (kernels/gated_delta/triton_verify.py) under Triton's interpreter:
a verify over several rows of a sequence == the decode kernels token after token, bit for bit, and the commit of
the kept rows == decoding exactly those (tests/gpu/verify_cases.py; on CUDA: tests/gpu/test_gdn_verify_gpu.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import interpret_harness

HERE = Path(__file__).resolve().parent
CPU = "cpu"


def _cases():
    sys.path.insert(0, str(HERE / "gpu"))
    import verify_cases as vc

    # hk 2, hv 4 (two value heads a key head), dk 16, dv 32; sequences of 1 to 4 rows, one fresh
    shapes = dict(hk=2, hv=4, dk=16, dv=32)
    return {
        "verify_split": lambda m: vc.check_verify_step(m, CPU, [3, 1, 4, 2], dv_block=16, **shapes),
        "verify_head": lambda m: vc.check_verify_step(m, CPU, [2, 4, 1], dv_block=None, **shapes),
        "verify_split_prep": lambda m: vc.check_verify_step(m, CPU, [4, 1, 3], dv_block=16, prep=(4, 32), **shapes),
        "verify_head_prep": lambda m: vc.check_verify_step(m, CPU, [1, 3], dv_block=None, prep=(8, 32), fresh=(0,),
                                                           **shapes),
        "conv_verify": lambda m: vc.check_conv_verify(m, CPU, 40, 4, [3, 1, 4, 2]),
        "conv_verify_k2": lambda m: vc.check_conv_verify(m, CPU, 24, 2, [2, 5], fresh=(0,)),
    }


CASE_NAMES = list(_cases())


def _child(names: list[str]) -> None:
    interpret_harness.run_cases(names, _cases, {"gdn": "gated_delta.triton_decode",
                                                "verify": "gated_delta.triton_verify"})


@pytest.fixture(scope="module")
def results():
    return interpret_harness.collect(__file__, CASE_NAMES)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_verify_kernels_under_interpreter(results, case):
    interpret_harness.check(results, case)


if __name__ == "__main__":
    interpret_harness.child_main(_child)
