"""Tensor- and expert-parallel models against one device, with N ranks in one process (tests/parallel_helpers.py:
threads that meet in an all-gather, the same rank-order sum as over gloo or NCCL).

For each checkpoint kind and N: the ranks' logits are identical to each other and within 1e-5 (relative, in the
2-norm) of the single-device logits in fp32 - or, where fp32 itself is less exact than that, within twice the
distance of the single-device fp32 logits from the same model run in fp64 (two fp32 evaluations of one function);
a sequence's logits alone or in a batch, and prefilled whole or in chunks, agree at that N within the same bound and
give the same greedy tokens (the reference path's own batch and chunk invariance on CPU:
tests/test_model_metamorphic.py); greedy tokens equal N = 1's. The synthetic tiny presets have random weights under
which fp32 rounding alone moves tiny-moe's logits by ~1e-4 (N = 1 fp32 against fp64; N = 2 against N = 1: ~5e-5);
the transformers-initialised checkpoints of test_quant_support are well conditioned (N = 2 against N = 1: ~6e-8)
and carry the bf16 and FP8 checks.
"""

from __future__ import annotations

import pytest
import torch

from deltaserve.model import ForwardBatch
from deltaserve.synthetic import get_preset, make_checkpoint
from deltaserve.synthetic.quantized import write_quantized_synthetic
from deltaserve.weights.loader import load_checkpoint
from parallel_helpers import load_ranks, run_ranks
from test_quant_support import fp8_release, write_hf_checkpoint

BLOCK = 16


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    wide = get_preset("tiny-moe")  # expert widths 64: a 2-way split keeps whole groups of 32 (MLX q4)
    wide.config["text_config"].update(moe_intermediate_size=64, shared_expert_intermediate_size=64)
    dense4 = get_preset("tiny-dense")  # 4 DeltaNet value heads: 4 ranks can split them
    dense4.config["text_config"].update(linear_num_value_heads=4)
    next_wide = get_preset("tiny-next")  # qwen3_next: flat config, group-interleaved in_proj_qkvz / in_proj_ba
    next_wide.config.update(moe_intermediate_size=64, shared_expert_intermediate_size=64, intermediate_size=128)
    hf = write_hf_checkpoint(root / "hf-moe", moe=True)
    return {
        "moe": make_checkpoint(root / "moe", "tiny-moe", dtype="fp32", progress=False),
        "dense": make_checkpoint(root / "dense", "tiny-dense", dtype="fp32", progress=False),
        "dense4": make_checkpoint(root / "dense4", dense4, dtype="fp32", progress=False),
        "q4": write_quantized_synthetic(root / "q4", wide, "q4", group_size=32, progress=False),
        "next": make_checkpoint(root / "next", "tiny-next", dtype="fp32", progress=False),
        "next-q4": write_quantized_synthetic(root / "next-q4", next_wide, "q4", group_size=32, progress=False),
        "hf-moe": hf,
        "hf-dense": write_hf_checkpoint(root / "hf-dense", moe=False, tie=True, seed=2),
        "fp8": fp8_release(hf, root / "fp8", block=16),
    }


def prompts(vocab: int, lens=(5, 21, 3), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def forward(model, seqs: list[list[int]], chunk: int | None = None) -> list[torch.Tensor]:
    """Every token's logits of each sequence: the sequences in one batch (chunk None), or each alone in chunks of
    `chunk` tokens (chunk boundaries on KV blocks)."""
    per = -(-max(len(s) for s in seqs) // BLOCK)  # blocks per sequence
    cache = model.make_cache(per * len(seqs), BLOCK, len(seqs))
    tables = [[per * b + i for i in range(per)] for b in range(len(seqs))]
    if chunk is None:
        batch = ForwardBatch.build(seqs, [0] * len(seqs), tables, list(range(len(seqs))), BLOCK, logits="all")
        return list(model(batch, cache).split([len(s) for s in seqs]))
    out = []
    for b, s in enumerate(seqs):
        parts = [model(ForwardBatch.build([s[i:i + chunk]], [i], [tables[b]], [b], BLOCK, logits="all"), cache)
                 for i in range(0, len(s), chunk)]
        out.append(torch.cat(parts))
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def fp32_noise(path, seqs, fp32: torch.Tensor) -> float:
    """How far the one-device fp32 logits are from the same model in fp64 (the parts the reference keeps in fp32,
    the DeltaNet rule, stay fp32 there too: a lower bound on fp32's own error)."""
    f64 = load_checkpoint(path, "cpu", torch.float64, progress=False).model
    return rel(fp32, torch.cat(forward(f64, seqs)))


def check(path, n: int, ep: bool = False, dtype=torch.float32, tol: float | None = None, decided=None):
    """decided: [tokens] bool, the positions whose greedy token must agree (default all)."""
    single = load_checkpoint(path, "cpu", dtype, progress=False).model
    ranks = load_ranks(path, n, dtype, ep)
    seqs = prompts(single.config.vocab_size)
    want = forward(single, seqs)
    # two fp32 evaluations of one function, each `noise` from the exact one, may be 2 * noise apart
    tol = max(1e-5, 2 * fp32_noise(path, seqs, torch.cat(want))) if tol is None else tol
    got = run_ranks(n, lambda r: forward(ranks[r], seqs))
    for r in range(1, n):  # every rank ends with the same logits, bit for bit (the same rank-order sums)
        assert all(torch.equal(a, b) for a, b in zip(got[r], got[0]))
    whole = torch.cat(got[0])
    assert rel(whole, torch.cat(want)) < tol
    keep = slice(None) if decided is None else decided
    assert torch.equal(whole.argmax(-1)[keep], torch.cat(want).argmax(-1)[keep])  # greedy tokens as on one device
    # batch and chunking invariance at this N, as the reference path has them at N = 1 (CPU matmuls are not
    # bitwise batch-invariant: tests/test_model_metamorphic.py): within the same bound, the same greedy tokens
    for other in (run_ranks(n, lambda r: [forward(ranks[r], [s])[0] for s in seqs])[0],
                  run_ranks(n, lambda r: forward(ranks[r], seqs, chunk=BLOCK))[0]):
        assert rel(torch.cat(other), whole) < tol
        assert torch.equal(torch.cat(other).argmax(-1)[keep], whole.argmax(-1)[keep])


@pytest.mark.parametrize("name, n, ep", [
    ("moe", 2, False), ("moe", 4, False), ("moe", 4, True), ("dense", 2, False), ("dense4", 4, False),
    ("q4", 2, False), ("q4", 2, True), ("next", 2, False), ("next-q4", 2, False), ("hf-moe", 2, False),
    ("hf-dense", 2, False),
])
def test_fp32_ranks_match_one_device(ckpts, name, n, ep):
    check(ckpts[name], n, ep)


def test_fp8_blocks_split_on_block_boundaries(ckpts):
    check(ckpts["fp8"], 2)


@pytest.mark.parametrize("ep", [False, True])
def test_bf16_stays_within_bf16_rounding_of_one_device(ckpts, ep):
    """bf16: the N = 2 logits are closer to the one-device bf16 logits than those are to fp32 (the partial sums are
    rounded to bf16 before the exchange, so the difference is of bf16 rounding's size), and give the same greedy
    token wherever the fp32 top-1 margin exceeds twice that rounding on its row (a closer call is a coin toss for
    bf16 at N = 1 already); the ranks agree bit for bit."""
    path = ckpts["hf-moe"]
    seqs = prompts(300)
    fp32 = torch.cat(forward(load_checkpoint(path, "cpu", torch.float32, progress=False).model, seqs))
    one = torch.cat(forward(load_checkpoint(path, "cpu", torch.bfloat16, progress=False).model, seqs))
    top2 = fp32.topk(2, dim=-1).values
    decided = top2[:, 0] - top2[:, 1] > 2 * (one - fp32).abs().amax(-1)
    assert decided.float().mean() > 0.8  # most positions are decided: the check says something
    check(path, 2, ep, torch.bfloat16, tol=rel(one, fp32), decided=decided)
