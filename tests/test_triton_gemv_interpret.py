"""The decode GEMV (`kernels/quant/triton_gemv.py`) and the parallel MoE decode (`kernels/moe/triton_moe_gemv.py`)
under Triton's interpreter on CPU (TRITON_INTERPRET=1 in a child process, as tests/test_triton_interpret.py does),
against fp64 references on fresh random inputs with NaN-poisoned outputs, plus bit-for-bit batch invariance."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import interpret_harness

HERE = Path(__file__).resolve().parent
CPU = "cpu"


def _cases():
    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    import kernel_cases as kc
    import test_gemv_gpu as tg

    # every format at M = 3 (rows alone: the invariance cases below), M = 1 at the model's q4g64
    cases = {f"gemv_b{b}_g{g}_m{m}": (lambda mods, b=b, g=g, m=m: tg.check_gemv(mods, CPU, b, g, m=m, n=24, k=256))
             for b in (4, 8) for g in (32, 64, 128) for m in (1, 3) if m == 3 or (b, g) == (4, 64)}
    cases.update({
        "gemv_m16_q4": lambda mods: tg.check_gemv(mods, CPU, 4, 64, m=16, n=40, k=128),
        "gemv_m11_q8_ragged_n": lambda mods: tg.check_gemv(mods, CPU, 8, 32, m=11, n=13, k=128),
        "gemv_dense": lambda mods: tg.check_gemv(mods, CPU, 16, 64, m=5, n=24, k=512),
        "gemv_batch_invariance": lambda mods: tg.check_gemv_invariance(mods, CPU, n=24, k=256),
        "gemv_row_pair": lambda mods: tg.check_gemv_row_pair(mods, CPU, n=12, k=512),
        "norm_prep": lambda mods: tg.check_norm_prep(mods, CPU, n=12, k=256),
        "gemv_matches_affine_matmul": lambda mods: tg.check_gemv_vs_matmul(mods, CPU, n=24, k=256),
        "gemv_errors": lambda mods: tg.check_gemv_errors(mods, CPU),
        "moe_v2_q4": lambda mods: tg.check_moe_v2(mods, CPU, t=3, h=64, e=8, i=32, top_k=3, bits=4, group=32),
        "moe_v2_bf16": lambda mods: tg.check_moe_v2(mods, CPU, t=2, h=64, e=8, i=32, top_k=3, bits=16, group=32),
        "moe_v2_unnormalised": lambda mods: tg.check_moe_v2(mods, CPU, t=2, h=64, e=8, i=64, top_k=2, bits=4,
                                                            group=32, normalize=False),
        # among 1 and 4 others here (15 others: 60+ s of interpreter time; the GPU test runs 1, 3, 15)
        "moe_v2_batch_invariance": lambda mods: tg.check_moe_v2_invariance(mods, CPU, h=64, e=8, i=64, top_k=3,
                                                                          others=(1, 4)),
        # a shared expert narrower than the routed ones, both x paths (the prep of the SwiGLU rows is per width)
        "moe_v2_shared_narrower_prep": lambda mods: tg.check_moe_v2(mods, CPU, t=3, h=64, e=8, i=64, top_k=3, bits=4,
                                                                   group=32, i_s=32, inline_prep=False),
        "moe_v2_shared_narrower_inline": lambda mods: tg.check_moe_v2(mods, CPU, t=3, h=64, e=8, i=64, top_k=3,
                                                                     bits=4, group=32, i_s=32),
        # one-launch paths: prep inlined, conv in the GEMV epilogue, top-k inside the MoE gate/up
        "gemv_inline_prep_q4": lambda mods: _bit_identical(kc.check_gemv_inline_prep(mods, CPU, 4, 64, m=3, n=24,
                                                                                       k=256)),
        "gemv_inline_prep_q8_ragged": lambda mods: _bit_identical(kc.check_gemv_inline_prep(mods, CPU, 8, 32, m=5,
                                                                                              n=13, k=128)),
        "gemv_inline_prep_fp16": lambda mods: _bit_identical(kc.check_gemv_inline_prep(mods, CPU, 4, 32, m=2, n=16,
                                                                                         k=128, dtype=torch.float16)),
        "gemv_inline_unaligned_rows": lambda mods: kc.check_gemv_inline_unaligned(mods, CPU, n=16, k=128),
        "gemv_inline_batch_invariance": lambda mods: kc.check_gemv_inline_invariance(mods, CPU, n=24, k=256),
        "gemv_conv_q4": lambda mods: kc.check_gemv_conv(mods, CPU, 4, 64, m=3, c=40, extra=24, k=128),
        "gemv_conv_q8_kw3_fresh": lambda mods: kc.check_gemv_conv(mods, CPU, 8, 32, m=2, c=16, extra=10, k=64,
                                                                  kw=3, fresh=(0,)),
        "gemv_conv_q4_kw2_all_channels": lambda mods: kc.check_gemv_conv(mods, CPU, 4, 32, m=2, c=24, extra=0,
                                                                         k=64, kw=2, fresh=(1,)),
        "gemv_conv_dense_m9": lambda mods: kc.check_gemv_conv(mods, CPU, 16, 64, m=9, c=16, extra=8, k=128,
                                                              fresh=(0, 8)),
        "gemv_conv_early_q4": lambda mods: kc.check_gemv_conv_early(mods, CPU, 4, 64, c=40, extra=24, k=128),
        "gemv_conv_early_q8_fresh": lambda mods: kc.check_gemv_conv_early(mods, CPU, 8, 32, c=16, extra=10, k=64,
                                                                          kw=3, fresh=(0,)),
        "gemv_conv_batch_invariance": lambda mods: kc.check_gemv_conv_invariance(mods, CPU, c=16, extra=8, k=128),
        "moe_v2_fused_q4": lambda mods: _bit_identical(kc.check_moe_v2_fused(mods, CPU, 2, 64, 8, 32, 3, 4, 32)),
        "moe_v2_fused_no_shared_q8": lambda mods: kc.check_moe_v2_fused(mods, CPU, 2, 64, 8, 32, 2, 8, 32,
                                                                        shared=False),
        "moe_v2_fused_ties": lambda mods: kc.check_moe_v2_fused_ties(mods, CPU),
        "gemv_inline_policy": _inline_policy,
        "topk_contract_e37_k8": lambda mods: kc.check_topk_contract(mods, CPU, 37, 8),
        "topk_contract_e256_k8": lambda mods: kc.check_topk_contract(mods, CPU, 256, 8),
        "topk_contract_e37_k3": lambda mods: kc.check_topk_contract(mods, CPU, 37, 3),
        "topk_contract_unnormalised": lambda mods: kc.check_topk_contract(mods, CPU, 37, 3, normalize=False),
        "routing_forms_same_bits": lambda mods: kc.check_routing_forms_same_bits(mods, CPU, tokens=12, h=64, e=16,
                                                                                 k=3),
    })
    return cases


def _inline_policy(mods) -> None:
    """Auto prep choice: the prep launch for every packed weight (never by M); an explicit choice wins; dense
    weights never prep."""
    from deltaserve.kernels.triton_common import WeightSpec
    import torch

    g = mods["gemv"]

    def spec(n, bits=4):
        if bits == 16:
            return WeightSpec.dense(torch.zeros(n, 64, dtype=torch.bfloat16), "w")
        return WeightSpec(torch.zeros(n, 8, dtype=torch.int32), torch.zeros(n, 1).bfloat16(),
                          torch.zeros(n, 1).bfloat16(), 4, 64, "w")

    assert not g.use_inline_prep(spec(12352), None) and not g.use_inline_prep(spec(512), None)
    assert not g.use_inline_prep(spec(248320), None)
    assert g.use_inline_prep(spec(248320), True) and not g.use_inline_prep(spec(512), False)
    assert not g.use_inline_prep(spec(512, 16), True)


def _bit_identical(same: bool) -> None:
    """Inline prep vs prep path: the products are the same bits and a group sum of bf16 values is exact in fp32
    unless its values span more than ~2^16 in magnitude, so on these seeded normal inputs the results are equal
    bit for bit (in general they may differ in the last fp32 bit of a group sum: the summation orders differ)."""
    assert same, "inline prep and prep path differ on the seeded inputs"


def _names():
    # the names are static; building them imports torch and the references, never triton
    return list(_cases())


CASE_NAMES = _names()


def _child(names: list[str]) -> None:
    """Runs in the child process, TRITON_INTERPRET=1 already in the environment."""
    interpret_harness.run_cases(names, _cases, {
        "gemv": "quant.triton_gemv", "affine": "quant.triton_affine", "moe": "moe.triton_decode",
        "moe2": "moe.triton_moe_gemv", "gdn": "gated_delta.triton_decode"})


@pytest.fixture(scope="module")
def results():
    return interpret_harness.collect(__file__, CASE_NAMES)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_gemv_under_interpreter(results, case):
    interpret_harness.check(results, case)


if __name__ == "__main__":
    interpret_harness.child_main(_child)
