"""The Triton kernels run on CPU through Triton's interpreter (TRITON_INTERPRET=1) at tiny shapes, against fp64
references: the CI check that the GPU path is still correct code (tests/gpu runs the same cases on CUDA).

The interpreter must be chosen before Triton itself is imported (triton.language's own helpers such as tl.zeros
and tl.sum are @triton.jit functions, decorated at import), and switching it on in this process would leak into
other tests. So one child process runs every case with the variable set (`python this_file CASE...`), reports one
JSON line per case, and each test here asserts its case's line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import interpret_harness

HERE = Path(__file__).resolve().parent
CPU = "cpu"


def _cases():
    """name -> function(mods) running one check. Imported lazily: the child needs TRITON_INTERPRET set first."""
    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    import kernel_cases as kc

    def affine_invariance(mods):
        # interpreter version of the GPU bit-for-bit test: row 0 alone == row 0 among 1, 3, 15 and 63 others
        packed, s, b, _ = kc.affine_weight((48, 128), 4, 64, CPU)
        x = torch.randn(64, 128).bfloat16()
        alone = mods["affine"].affine_matmul(x[:1], packed, s, b, 4, 64)
        for m in (2, 4, 16, 64):
            assert torch.equal(mods["affine"].affine_matmul(x[:m], packed, s, b, 4, 64)[:1], alone), f"M={m}"

    def affine_errors(mods):
        packed, s, b, _ = kc.affine_weight((16, 64), 4, 32, CPU)
        x = torch.zeros(1, 64).bfloat16()
        for args, msg in (((x, packed, s[:, :1], b, 4, 32), "scales shape"), ((x, packed, s, b, 3, 32), "bits 3"),
                          ((x[:, :32], packed, s, b, 4, 32), "input has 32 features")):
            try:
                mods["affine"].affine_matmul(*args)
            except ValueError as exc:
                assert msg in str(exc), str(exc)
            else:
                raise AssertionError(f"no error for {msg}")

    def dense(mods):
        x, w = torch.randn(5, 64).bfloat16(), torch.randn(24, 64).bfloat16()
        kc.close(mods["affine"].dense_matmul(x, w), x.double() @ w.double().t(), 2 * kc.BF16_EPS, "dense_matmul")

    def gates(mods):
        from deltaserve.kernels.gated_delta import gdn_gates

        a, b = torch.randn(5, 6).bfloat16() * 8, torch.randn(5, 6).bfloat16()
        a_log, dt_bias = torch.randn(6), torch.randn(6).bfloat16()
        g, beta = mods["gdn"].gdn_gates(a, b, a_log, dt_bias)
        rg, rb = gdn_gates(a.double(), b.double(), a_log.double(), dt_bias.double())
        kc.close(g, rg, 1e-6, "gdn gates g")
        kc.close(beta, rb, 1e-6, "gdn gates beta")

    cases = {f"affine_b{b}_g{g}": (lambda m, b=b, g=g: kc.check_affine(m, CPU, b, g, m=3, n=40, k=256))
             for b in (2, 4, 8) for g in (32, 64, 128)}
    cases.update({
        **{f"embed_b{b}_g{g}": (lambda m, b=b, g=g: kc.check_affine_embed(m, CPU, b, g, v=50, h=256, t=9))
           for b, g in ((2, 32), (4, 64), (8, 128))},
        "greedy_advance": lambda m: kc.check_greedy_advance(m, CPU, b=5, v=70000),
        "affine_gemm_m17": lambda m: kc.check_affine(m, CPU, 4, 64, m=17, n=80, k=128),
        "affine_gemm_m70": lambda m: kc.check_affine(m, CPU, 8, 32, m=70, n=80, k=128),
        "affine_batch_invariance": affine_invariance,
        "affine_errors": affine_errors,
        "dense_matmul": dense,
        # the wide kernel's BK (128) under the interpreter; the GPU test runs the library's tiles (BK 64)
        "dense_dequant_q4": lambda m: kc.check_dense_dequant(m, CPU, 4, 64, 72, 256, (1, 33, 300),
                                                             ((32, 32, 128, 4, 2), (64, 16, 128, 4, 2))),
        "dense_dequant_q8_g32": lambda m: kc.check_dense_dequant(m, CPU, 8, 32, 40, 256, (5, 70),
                                                                 ((32, 32, 128, 4, 2),)),
        "dense_dequant_bf16": lambda m: kc.check_dense_dequant(m, CPU, 16, 1, 40, 256, (5, 70),
                                                               ((32, 32, 128, 4, 2),), dense=True),
        "affine_experts_q4": lambda m: kc.check_affine_experts(m, CPU, 4, 32, m=37, n=24, k=128, e=5, repeat=2),
        "expert_tiles": lambda m: kc.check_expert_tiles(m, CPU),
        "affine_experts_bf16": lambda m: kc.check_affine_experts(m, CPU, 16, 32, m=9, n=24, k=64, e=3, repeat=1),
        "moe_q4": lambda m: kc.check_moe(m, CPU, t=3, h=64, e=8, i=32, i_s=32, top_k=3, bits=4, group=32),
        "moe_bf16": lambda m: kc.check_moe(m, CPU, t=2, h=64, e=8, i=32, i_s=32, top_k=3, bits=16, group=32),
        "moe_unnormalised_dense_router": lambda m: kc.check_moe(m, CPU, t=2, h=64, e=8, i=64, i_s=32, top_k=2,
                                                                bits=4, group=32, normalize=False, router_bits=16),
        "moe_router_ties": lambda m: kc.check_moe_ties(m, CPU),
        "moe_router_rows": lambda m: kc.check_router_rows(m, CPU, ts=(1, 13)),
        "moe_router_mma_q8": lambda m: kc.check_router_mma(m, CPU),
        "moe_router_mma_q4_g32": lambda m: kc.check_router_mma(m, CPU, ts=(1, 65), h=64, e=24, bits=4, group=32),
        "moe_route_prefill_mma": lambda m: kc.check_route_prefill_mma(m, CPU, ts=(1, 40), h=64, e=12, top_k=3,
                                                                      group=32),
        "moe_down_early": lambda m: kc.check_moe_down_early(m, CPU, 2, 64, 8, 32, 3, 4, 32),
        "moe_router_last_arrival": lambda m: kc.check_router_last_arrival(m, CPU, ts=(1, 7)),
        # 33 tokens: both bitmap words; the GPU test runs more token counts and tile widths
        "moe_route_tiles": lambda m: kc.check_route_tiles(m, CPU, ts=(33,), rows=(8,), reps=2),
        # H 128: both levels of the norm's sum of squares; the GPU test runs the 35B router
        "moe_router_norm": lambda m: kc.check_router_norm(m, CPU, ts=(1, 3)),
        "conv_varlen": lambda m: kc.check_conv(m, CPU, c=48, kw=4, seqs=[5, 1, 2, 19], ctx=[3, 0, 7, 0]),
        "conv_sections": lambda m: kc.check_conv_sections(m, CPU, 64, 64, 128, 4, seqs=[5, 1, 19], ctx=[3, 0, 0]),
        "gdn_initial_states": lambda m: kc.check_initial_states(m, CPU),
        # chunk edges inside and on the 16-token blocks; the weight both ways (the prefill's taps-major view)
        "conv_chunks": lambda m: [kc.check_conv_chunks(m, CPU, 48, 4, 70, (1, 16, 19, 35), taps_major=tm)
                                  for tm in (False, True)],
        "conv_sections_narrow": lambda m: kc.check_conv_sections(m, CPU, 16, 16, 40, 4, seqs=[3, 17], ctx=[0, 2]),
        "gdn_decode": lambda m: kc.check_gdn_decode(m, CPU, b=3, hk=2, hv=4, dk=16, dv=32, fresh_rows=(1,)),
        "gdn_decode_one_program_per_head": lambda m: kc.check_gdn_decode(m, CPU, b=3, hk=2, hv=4, dk=16, dv=32,
                                                                         fresh_rows=(1,), dv_block=None),
        "gdn_decode_split_vs_whole": lambda m: kc.check_gdn_split_vs_whole(m, CPU, 3, 2, 4, 16, 32, blocks=(8, 16)),
        "gdn_decode_prep_q4": lambda m: kc.check_gdn_prep(m, CPU, 3, 2, 4, 16, 64),
        "gdn_decode_prep_q8_one_program_per_head": lambda m: kc.check_gdn_prep(m, CPU, 2, 2, 4, 16, 64, None, bits=8),
        "gdn_gates": gates,
        "paged_attention": lambda m: kc.check_attention(m, CPU, ctx=[0, 13, 5, 150], seqs=[7, 3, 1, 20], hq=4,
                                                        hkv=2, d=32, bs=8),
        "norms": lambda m: kc.check_norms(m, CPU, rows=3, n=96, dv=32),
    })
    cases.update(_attn_fused_cases())
    cases.update(_kv_fp8_cases())
    return cases


def _split(m) -> int:
    return m["attn"].split_tokens()


def _around_split(m, first, *offsets) -> list[int]:
    """[first] + lengths S + offset for the decode split size S (the last offset past 2 S: several splits)."""
    s = _split(m)
    return [first] + [s + o for o in offsets[:-1]] + [2 * s + offsets[-1]]


def _kv_fp8_cases():
    """The fp8 K/V cache's writers and readers (tests/gpu/kv_fp8_cases.py), tiny shapes."""
    import kv_fp8_cases as fc

    return {
        "kv_fp8_format": lambda m: fc.check_format(CPU),
        "kv_fp8_write_kv": lambda m: fc.check_write_kv(m, CPU, ctx=[0, 13, 5], seqs=[7, 3, 1], hq=4, hkv=2, d=32,
                                                       bs=8),
        "kv_fp8_qk_prep": lambda m: fc.check_qk_prep(m, CPU, 5, hq=4, hkv=2, d=32, rd=16),
        "kv_fp8_attention": lambda m: fc.check_attention(m, CPU, ctx=[0, 13, 5, 150], seqs=[7, 3, 1, 20], hq=4,
                                                         hkv=2, d=32, bs=8),
        "kv_fp8_errors": lambda m: fc.check_errors(m, CPU),
    }


def _attn_fused_cases():
    """The attention layer's fused decode kernels (tests/gpu/attn_fused_cases.py), tiny shapes: rotary 16 of 32."""
    import attn_fused_cases as ac

    dims = dict(hq=4, hkv=2, d=32, rd=16)
    cases = {f"qk_prep_{kind}": (lambda m, kind=kind: ac.check_qk_prep(m, CPU, 5, kind=kind, **dims))
             for kind in ("text", "mrope3", "mrope_text")}
    cases.update({
        "qk_prep_offset0": lambda m: ac.check_qk_prep(m, CPU, 3, offset=0.0, **dims),
        "qk_prep_cos_sin_tables": lambda m: ac.check_qk_prep(m, CPU, 5, kind="mrope3", table=True, **dims),
        "qk_prep_mrope_text_equals_text": lambda m: ac.check_qk_prep_mrope_text(m, CPU, 4, **dims),
        "qk_prep_errors": lambda m: ac.check_qk_prep_errors(m, CPU),
        "qk_prep_batch_invariance": lambda m: ac.check_qk_prep_invariance(m, CPU, (1, 4), **dims),
        # lengths around the library's split size S: one split, exactly S, S + 1 (two), several
        "decode_gate": lambda m: ac.check_decode_gate(m, CPU, _around_split(m, 1, -28, 0, 1, 44), 4, 2, 32, 8,
                                                      _split(m)),
        "decode_gate_single_split": lambda m: ac.check_decode_gate(m, CPU, [1, _split(m) // 2, _split(m)], 4, 2, 32,
                                                                   8, _split(m)),
        "decode_strided": lambda m: ac.check_decode_strided(m, CPU, _around_split(m, 1, -28, 0, 1, 300), 4, 2, 32, 8,
                                                            _split(m)),
        # one row at FROM (its bits kept), longer ones in 2- and 4-tile splits (one partial, several)
        "decode_long_split": lambda m: ac.check_decode_long_split(
            m, CPU, [_split(m) + 5, 2 * _split(m), 2 * _split(m) + 1, 7 * _split(m) + 3, 1], 4, 2, 32, 8, _split(m),
            ((2 * _split(m), 2), (_split(m), 4))),
        "decode_merge_steps": lambda m: ac.check_decode_merge_steps(m, CPU, [1, 1100, 256, 700], 4, 2, 32, 8,
                                                                    _split(m), 2, 16),
        "decode_merge_prep": lambda m: ac.check_decode_merge_prep(
            m, CPU, [1, _split(m), 5 * _split(m) + 3, _split(m) + 1, 20], 4, 2, 32, 8, _split(m), [(4, 32), (8, 16)],
            merges=(None, (2, 16))),
        "attention_decode_fused_vs_unfused": lambda m: ac.check_attention_decode_fused(
            m, CPU, _around_split(m, 1, 40 - _split(m), 0, 1, 4), 4, 2, 32, 16, 8),
        "decode_gate_batch_invariance": lambda m: ac.check_decode_gate_invariance(
            m, CPU, [200, 1, 128, 129, 300, 50], (1, 3, 5), 4, 2, 32, 8),
    })
    return cases


CASE_NAMES = list(_cases())  # importing the cases pulls in torch and the references, never triton


def _child(names: list[str]) -> None:
    """Runs in the child process, TRITON_INTERPRET=1 already in the environment."""
    interpret_harness.run_cases(names, _cases, {
        "affine": "quant.triton_affine", "moe": "moe.triton_decode", "gdn": "gated_delta.triton_decode",
        "attn": "attention.triton_paged", "norm": "triton_norm", "qkprep": "attention.triton_qk_prep",
        "moe2": "moe.triton_moe_gemv", "embed": "quant.triton_embed",
        "greedy": "triton_greedy"})


@pytest.fixture(scope="module")
def results():
    return interpret_harness.collect(__file__, CASE_NAMES)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_kernel_under_interpreter(results, case):
    interpret_harness.check(results, case)


if __name__ == "__main__":
    interpret_harness.child_main(_child)


def test_reference_switch(monkeypatch):
    """kernels.backend: the explicit switch wins, then DELTASERVE_REFERENCE, then Triton's availability."""
    from deltaserve.kernels import backend

    monkeypatch.delenv("DELTASERVE_REFERENCE", raising=False)
    previous = backend.use_reference(None)
    try:
        assert backend.reference_enabled() == (not backend.triton_available())
        monkeypatch.setenv("DELTASERVE_REFERENCE", "1")
        assert backend.reference_enabled()
        assert backend.use_reference(False) is None
        assert not backend.reference_enabled()  # the explicit switch beats the environment
        with backend.reference():
            assert backend.reference_enabled()
        assert not backend.reference_enabled()
        backend.use_reference(None)
        monkeypatch.setenv("DELTASERVE_REFERENCE", "maybe")
        with pytest.raises(ValueError, match="DELTASERVE_REFERENCE"):
            backend.reference_enabled()
        with pytest.raises(TypeError):
            backend.use_reference(1)
    finally:
        backend.use_reference(previous)
