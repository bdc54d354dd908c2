"""The DeltaNet decode step writing its out projection's GEMV prep (fast.gdn_step_prep),
end to end on the model's fast path through Triton's interpreter: a q4 g64 model whose value heads are one q4
group wide (dv = 64, the smallest the step can prep) decodes the same greedy tokens with logits equal to the prep
launch's within fp32 rounding of the group sums, the prep really in use at every DeltaNet layer. (The kernel itself,
with a row alone == in the batch: tests/gpu/kernel_cases.check_gdn_prep, in test_triton_interpret.py and
on the GPU; the GPU model test: test_model_mma_path.py's prep_model.)"""

from __future__ import annotations

import sys

import pytest

from prep_interpret import prefilled_decoder, q4_checkpoint, run_child, spy_and_count


def _child(ckpt: str) -> None:
    import torch

    from deltaserve.kernels.gated_delta import triton_decode

    preps, made = spy_and_count(triton_decode, "gdn_decode_step")
    decode = prefilled_decoder(ckpt, [[3, 5, 7], [8, 30]], [[0, 1], [2, 3]], "gdn_step_prep")
    launch = decode(False)
    assert set(preps) == {None}, preps
    counts, preps[:] = dict(made), []
    step = decode(True)
    assert set(preps) == {(4, 64)} and len(preps) == 2, f"the step's prep was not in use at every layer: {preps}"
    # each DeltaNet layer's out projection took the step's prep instead of a prep launch
    assert made["prep_x"] - counts["prep_x"] == counts["prep_x"] - 2, (counts, made)
    assert made["carried"] - counts["carried"] == counts["carried"] + 2, (counts, made)
    rel = ((step - launch).abs().max() / launch.abs().max()).item()
    assert rel < 1e-3 and torch.equal(step.argmax(-1), launch.argmax(-1)), f"step prep vs launch: {rel:.3g}"
    print("OK", rel)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # two DeltaNet layers (no attention layer: the fast path's attention is covered elsewhere; interpreter time)
    return q4_checkpoint(tmp_path_factory, num_hidden_layers=2, linear_value_head_dim=64)


@pytest.mark.slow
def test_step_prep_equals_prep_launch_end_to_end(checkpoint):
    run_child(__file__, checkpoint)


if __name__ == "__main__":
    _child(sys.argv[1])
