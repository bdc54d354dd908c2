"""The decode attention's merge writing its out projection's GEMV prep (fast.attn_merge_prep), end to end on the
model's fast path through Triton's interpreter: a q4 g64 model of one full-attention layer whose heads are one q4 group wide (head_dim 64) decodes a step of two rows, one merged
over two splits (a 70-token context) and one finished by its split program, with logits equal to the prep launch's
bit for bit (the merge's prep is prep_row's arithmetic on the same values), the prep really made by the merge and
no prep launch for the out projection. (The kernel itself, bit for bit against prep_x with poisoned buffers:
tests/gpu/attn_fused_cases.check_decode_merge_prep, in test_triton_interpret.py and on the GPU.)"""

from __future__ import annotations

import sys

import pytest

from prep_interpret import prefilled_decoder, q4_checkpoint, run_child, spy_and_count


def _child(ckpt: str) -> None:
    import torch

    from deltaserve.kernels.attention import triton_paged

    preps, made = spy_and_count(triton_paged, "paged_decode_attention")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 32, (70,), generator=g).tolist(), [8, 30, 5]]
    tables = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # 80 tokens a row: the host bound spans two splits of 64
    decode = prefilled_decoder(ckpt, prompts, tables, "attn_merge_prep")
    launch = decode(False)
    assert preps == [None], preps
    counts, preps[:] = dict(made), []
    merged = decode(True)
    assert preps == [(4, 64)], f"the merge's prep was not in use: {preps}"
    # the out projection took the merge's prep instead of a prep launch; every other GEMV as before
    assert made["prep_x"] - counts["prep_x"] == counts["prep_x"] - 1, (counts, made)
    assert made["carried"] - counts["carried"] == counts["carried"] + 1, (counts, made)
    assert torch.equal(merged, launch), "merge prep vs prep launch: the logits' bits changed"
    print("OK")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # one full-attention layer (the DeltaNet layers' fast path is covered elsewhere; interpreter time), heads of 64
    rope = dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[3, 3, 2],
                mrope_interleaved=True)
    return q4_checkpoint(tmp_path_factory, num_hidden_layers=1, layer_types=["full_attention"], head_dim=64,
                         rope_parameters=rope)


@pytest.mark.slow
def test_merge_prep_equals_prep_launch_end_to_end(checkpoint):
    run_child(__file__, checkpoint)


if __name__ == "__main__":
    _child(sys.argv[1])
