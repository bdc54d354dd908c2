"""End-to-end GPU tests of the tensor-core paths on a q4 g64 model, each mode a kernel plan (model/plan.py) fixed on
the model: moe "mma" (every MoE block through kernels/moe/mma_moe.py, the experts repacked once and their MLX
tensors released) with decode_gemv "mma" (the decode linears through kernels/quant/mma_gemv.py), and moe "cuda" with
decode_gemv "head" (the CUDA-core paths with the output head alone on the tensor-core GEMV); some modes also lower a
kernel's size threshold (a launch-table constant) so that the tiny model reaches it. The tiny bf16 model of test_model_fast_path cannot reach
these paths (they serve q4 g64 weights only), so this one is quantised by our quantiser first, with expert widths
that are multiples of 64.

Run on the H200: `pytest -m gpu tests/gpu/test_model_mma_path.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from deltaserve.kernels import launch_table
from deltaserve.kernels.moe import wgmma_experts as wx
from deltaserve.model import fast, fusion
from deltaserve.model.gated_deltanet import GatedDeltaNet
from deltaserve.model.plan import KernelPlan
from deltaserve.model.mlp import SparseMoeBlock
from deltaserve.weights.loader import load_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from test_model_fast_path import (
    check_batch_invariance,
    check_graph_equals_eager,
    check_matches_cpu_reference,
    decode_logits,
)

sys.path.insert(0, str(Path(__file__).parent.parent))
from model_helpers import make_hf_model, ours_from_checkpoint  # noqa: E402

pytestmark = pytest.mark.gpu
MODES = {  # name -> (the deployment's kernel plan, {launch-table constant: value} for the mode)
    "mma": (KernelPlan("mma", "mma"), {}),
    # the tensor-core MoE with the default GEMVs (the output head alone on the tensor-core GEMV): the default
    # layout (lab/NOTES.md)
    "mma-moe": (KernelPlan("head", "mma"), {}),
    # the same with every MoE block's gate/up and down on the warpgroup-MMA experts kernel (prefill sizes by
    # default; here from one row, decode included): the mma.sync kernel's bits
    "mma-moe-wgmma": (KernelPlan("head", "mma"), {"moe_wgmma.min_rows": 1}),
    # the tensor-core GEMVs with every weight wgmma_gemv.wg_gemv can take on it from one row (the same bits)
    "mma-wg-gemv": (KernelPlan("mma", "mma"), {"gemv_tc.wg_gemv_rows": 1}),
    # the same with the MoE on the wgmma experts kernel too (x's group sums staged in shared memory, the slots
    # carried: the kernel's forms; the same bits)
    "mma-wg-xs": (KernelPlan("mma", "mma"), {"gemv_tc.wg_gemv_rows": 1, "moe_wgmma.min_rows": 1}),
    # the CUDA-core paths but the output head on the tensor-core GEMV
    "head": (KernelPlan("head", "cuda"), {}),
}
# (the tiny models have no weight of K = 4096, so gemv_tc.wg_gemv_rows' shape-keyed value never applies)
DEFAULTS = {name: launch_table.value(name) for _, patches in MODES.values() for name in patches}


@pytest.fixture(scope="module", params=sorted(MODES))
def models(request, tmp_path_factory):
    """(CPU fp32 reference, GPU bf16 model on the tensor-core paths of the mode, mode) of one q4 g64 checkpoint:
    the tiny MoE with experts of width 64 (hidden 64, 8 experts, top-2, a shared expert of the same width: stacked
    last)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    src = tmp_path_factory.mktemp("bf16")
    # 8 value heads: the DeltaNet in_proj (q|k|v|z|b|a) has 336 rows, a multiple of 16, so the tensor-core GEMV
    # (and its conv epilogue) serves it too
    hf = make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                       linear_num_value_heads=8)
    for name, p in hf.named_parameters():
        if not name.endswith("A_log"):
            p.data.copy_(p.data.bfloat16().float())
    ours_from_checkpoint(hf, src)
    q4 = quantize_checkpoint(src, tmp_path_factory.mktemp("q4"), 4, 64, progress=False)
    cpu = load_checkpoint(q4, dtype=torch.float32, progress=False).model
    plan, patches = MODES[request.param]
    with launch_table.override(patches):
        gpu = load_checkpoint(q4, device="cuda", dtype=torch.bfloat16, progress=False).model
        fast.set_plan(gpu, plan)
        yield cpu, gpu, request.param


def test_tensor_core_paths_in_use(models):
    """The modes really serve this model: after a prefill and a decode step every MoE block holds its repacked
    experts (the shared expert stacked last) with the MLX tensors released, and the decode linears their copies."""
    _, gpu, mode = models
    decode_logits(gpu, [[1, 2, 3, 4, 5]], 1, graph=False)
    blocks = [m for m in gpu.modules() if isinstance(m, SparseMoeBlock)]
    mixers = [m for m in gpu.modules() if isinstance(m, GatedDeltaNet)]
    assert blocks and mixers
    assert fast.state(gpu.lm_head).mma, "the output head did not take the tensor-core GEMV"
    if mode == "head":  # nothing else did
        assert not any(fast.state(b).mma for b in blocks)
        assert not any(fast.state(fusion.fused(m, "in_proj")).mma for m in mixers)
        head_copy = fast.state(gpu.lm_head).mma
        assert fast.decode_copy_bytes(gpu) == sum(t.numel() * t.element_size() for t in head_copy)
        return
    for b in blocks:
        mma = fast.state(b).mma
        assert mma and mma.shared_last, "an MoE block did not take the tensor-core path"
        assert fast.state(b.experts).released and b.experts.gate_proj.weight.numel() == 0
    assert fast.decode_copy_bytes(gpu) > 0
    if mode == "mma-moe-wgmma":  # moe_block_mma's condition for the warpgroup-MMA experts kernel, from one row
        assert wx.wg_min_rows() == 1 and all(wx.wg_fits(
            fast.state(b).mma.gate[0], fast.state(b).mma.down[0]) for b in blocks)
    if mode in ("mma-moe", "mma-moe-wgmma"):  # the decode linears stay on CUDA cores
        assert not any(fast.state(fusion.fused(m, "in_proj")).mma for m in mixers)
        with pytest.raises(RuntimeError, match="released"):
            fast.stacked_specs(blocks[0].experts)
        return
    assert all(fast.state(fusion.fused(m, "in_proj")).mma for m in mixers), \
        "a DeltaNet in_proj did not take the tensor-core GEMV (and its conv epilogue)"
    with pytest.raises(RuntimeError, match="released"):
        fast.stacked_specs(blocks[0].experts)


@pytest.mark.parametrize("chunk", [None, 1, 64])
def test_q4_mma_gpu_matches_cpu_reference(models, chunk):
    """Against the CPU fp32 run of the same q4 checkpoint: prefill whole (the MoE at 200 tokens: sorted expert
    tiles), in chunks of 64, or one token per call (single-row tiles)."""
    cpu, gpu, mode = models
    check_matches_cpu_reference(cpu, gpu, chunk, f"q4 {mode} prefill chunk {chunk}")


def test_q4_mma_batch_invariance_bit_for_bit(models):
    check_batch_invariance(models[1])


def test_q4_mma_graph_replay_equals_eager(models):
    check_graph_equals_eager(models[1])


def test_router_norm_in_use_and_equal_to_the_norm_launch(models, monkeypatch):
    """Each decode-sized MoE block's router launch making the block's input norm itself
    (kernels/moe/triton_decode.route_normed) == the norm kernel, then the router: decode logits bit for bit, eager and from a graph; and the fused form really ran at 1 and 3 rows (not in the mode whose MoE takes
    the warpgroup-MMA kernel's tiles from one row: mma-moe-wgmma and mma-wg-xs)."""
    from deltaserve.kernels.moe import triton_decode as md

    _, gpu, mode = models
    gen = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, 32, (n,), generator=gen).tolist() for n in (7, 30, 12)]
    rows, real = [], md.route_normed

    def counting(x, *args, **kwargs):
        rows.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(md, "route_normed", counting)
    fused = [decode_logits(gpu, p, 4, graph=g) for p in (prompts[:1], prompts) for g in (False, True)]
    blocks = [m for m in gpu.modules() if isinstance(m, SparseMoeBlock)]
    # the CUDA-core MoE, and every mode whose MoE takes the warpgroup-MMA kernel (and its tiles) from one row
    if mode == "head" or "moe_wgmma.min_rows" in MODES[mode][1]:
        assert not rows, f"{mode}: the router made the norm at {sorted(set(rows))} rows"
    else:
        assert {1, 3} <= set(rows) and len(rows) >= 4 * 2 * len(blocks), f"{mode}: route_normed at {rows[:8]}"
    monkeypatch.setattr(md, "router_norm_tokens", lambda: 0)  # the norm kernel, then the router
    rows.clear()
    split = [decode_logits(gpu, p, 4, graph=g) for p in (prompts[:1], prompts) for g in (False, True)]
    assert not rows
    for i, (a, b) in enumerate(zip(fused, split)):
        assert torch.equal(a, b), f"{mode}: fused router norm != the norm launch (run {i})"


def _without_modes():
    """Every mode's constant at its default, for the length of a `with`. The module-scoped `models` keeps its last
    mode's constants until the module ends (pytest finalises a parametrized fixture only for its next param), and
    the tests below run after its tests: without this, the "default paths" models would run under that mode's
    thresholds."""
    return launch_table.override(DEFAULTS)


@pytest.fixture
def default_paths():
    """A test of the default paths: every mode's constant at its default (restored after the test)."""
    with _without_modes():
        yield


@pytest.fixture(scope="module")
def prep_model(tmp_path_factory):
    """The default paths on a q4 g64 model whose DeltaNet value heads are one q4 group wide (dv = 64), so the decode
    step writes its out projection's prep (fast.gdn_step_prep). The models above have
    dv = 16, which the step cannot prep (the out projection's prep launch runs instead)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    src = tmp_path_factory.mktemp("bf16_dv64")
    hf = make_hf_model(True, seed=1, vocab_size=32, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                       linear_num_value_heads=4, linear_value_head_dim=64)
    ours_from_checkpoint(hf, src)
    q4 = quantize_checkpoint(src, tmp_path_factory.mktemp("q4_dv64"), 4, 64, progress=False)
    with _without_modes():
        return load_checkpoint(q4, device="cuda", dtype=torch.bfloat16, progress=False).model


def test_gdn_step_prep_in_use_and_equal_to_the_prep_launch(prep_model, default_paths, monkeypatch):
    """With the step's prep the decode logits are the prep launch's to fp32 rounding of the group sums (the same
    greedy tokens); it is in use (the mixers' format is (4, 64)), and without it (the prep launch, the path of
    formats the step cannot prep) the path really differs."""
    mixers = [m for m in prep_model.modules() if isinstance(m, GatedDeltaNet)]
    x = torch.zeros(1, prep_model.config.hidden_size, dtype=torch.bfloat16, device="cuda")
    prompts = [[3, 5, 7, 9, 11, 2, 4], [8, 8, 1, 30, 22, 6, 6, 6, 9]]
    runs = {}
    chosen = fast.gdn_step_prep
    for mode in ("step", "launch"):
        monkeypatch.setattr(fast, "gdn_step_prep", chosen if mode == "step" else (lambda *args: None))
        want = (4, 64) if mode == "step" else None
        assert all(fast.gdn_step_prep(m.out_proj, x, m.dv, m.hv) == want for m in mixers), mode
        runs[mode] = decode_logits(prep_model, prompts, 6, graph=False)
    step, launch = runs["step"], runs["launch"]
    assert torch.isfinite(step).all()
    rel = ((step - launch).abs().max() / launch.abs().max()).item()
    assert rel < 1e-2, f"step prep vs prep launch: relative difference {rel:.3g}"
    assert torch.equal(step.argmax(-1), launch.argmax(-1)), "step prep changes the greedy tokens"


@pytest.fixture(scope="module")
def merge_prep_model(tmp_path_factory):
    """The default paths on a q4 g64 model whose attention heads are one q4 group wide (head_dim 64), so the decode
    attention's merge writes its out projection's prep (fast.attn_merge_prep)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    src = tmp_path_factory.mktemp("bf16_hd64")
    rope = dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[3, 3, 2],
                mrope_interleaved=True)
    hf = make_hf_model(True, seed=2, vocab_size=32, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                       head_dim=64, rope_parameters=rope)
    ours_from_checkpoint(hf, src)
    q4 = quantize_checkpoint(src, tmp_path_factory.mktemp("q4_hd64"), 4, 64, progress=False)
    with _without_modes():
        return load_checkpoint(q4, device="cuda", dtype=torch.bfloat16, progress=False).model


def test_attn_merge_prep_equals_the_prep_launch(merge_prep_model, default_paths, monkeypatch):
    """With the merge's prep the decode logits are the prep launch's bit for bit (prep_row's arithmetic on the same
    values), eager and replayed, over a merged row (a 70-token prompt) and single-split rows; it is in use at the
    attention layer and off without it (the prep launch); batch invariance and graph == eager hold with it."""
    from deltaserve.model.attention import GatedAttention

    layers = [m for m in merge_prep_model.modules() if isinstance(m, GatedAttention)]
    x = torch.zeros(1, merge_prep_model.config.hidden_size, dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, 32, (n,), generator=gen).tolist() for n in (70, 9, 33)]
    runs = {}
    chosen = fast.attn_merge_prep
    for mode in ("merge", "launch"):
        monkeypatch.setattr(fast, "attn_merge_prep", chosen if mode == "merge" else (lambda *args: None))
        want = (4, 64) if mode == "merge" else None
        assert layers and all(fast.attn_merge_prep(m.o_proj, x, m.hq, m.d) == want for m in layers), mode
        runs[mode] = [decode_logits(merge_prep_model, prompts, 4, graph=g) for g in (False, True)]
    assert torch.isfinite(runs["merge"][0]).all()
    assert torch.equal(runs["merge"][0], runs["launch"][0]) and torch.equal(runs["merge"][1], runs["launch"][1])
    monkeypatch.setattr(fast, "attn_merge_prep", chosen)
    check_batch_invariance(merge_prep_model)
    check_graph_equals_eager(merge_prep_model)


@pytest.mark.parametrize("plan", [KernelPlan("head"), KernelPlan("mma")])
def test_gdn_step_prep_batch_invariance_and_graphs(prep_model, default_paths, plan):
    """dv = 64: the step in blocks of 32 state columns (a batch-1 deployment's, two programs a head) or 64 (a
    throughput deployment's, one), each batch-invariant bit for bit and graph == eager."""
    fast.set_plan(prep_model, plan)
    check_batch_invariance(prep_model)
    check_graph_equals_eager(prep_model)


def _fifty_prompts(seed: int) -> list[list[int]]:
    """50 prompts of 1-39 tokens (a 50-row decode: past both forks' default thresholds)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 32, (int(n),), generator=gen).tolist() for n in torch.randint(1, 40, (50,), generator=gen)]


def test_mixer_halves_equal_one_launch(models, monkeypatch):
    """Each mixer (DeltaNet and attention) of a 50-row decode as two halves of the rows on two streams
    (fast.mixer_halves, from 48 rows by default) == one launch over all rows (MIXER_HALVES_ROWS = 0), bit for
    bit, eager and replayed from a graph (the two streams captured as two branches); the halves really taken."""
    _, gpu, mode = models
    prompts = _fifty_prompts(12)
    taken, mixer_halves = [], fast.mixer_halves

    def spy(rows, x, kind="deltanet"):
        ok = mixer_halves(rows, x, kind)
        taken.append((rows, kind)) if ok else None
        return ok

    monkeypatch.setattr(fast, "mixer_halves", spy)
    halves = {graph: decode_logits(gpu, prompts, 4, graph=graph) for graph in (False, True)}
    assert set(taken) == {(50, "deltanet"), (50, "attention")}, f"{mode}: the halves were not taken ({set(taken)})"
    monkeypatch.setattr(fast, "MIXER_HALVES_ROWS", 0)
    taken.clear()
    one = decode_logits(gpu, prompts, 4, graph=False)
    assert not taken
    assert torch.isfinite(one).all()
    for graph, got in halves.items():
        assert torch.equal(got, one), f"{mode}: the mixers' halves ({'graph' if graph else 'eager'}) change the logits"


def test_moe_tile_sets_equal_joint_launches(models, monkeypatch):
    """A 50-token decode's MoE blocks with their expert tiles as two sets on two streams (fast.moe_fork, from 16
    tokens by default: even and odd tiles, each set's gate/up then down a chain of its own) == the joint launches
    (MOE_HALVES_TOKENS = 0), bit for bit, eager and replayed from a graph; in the modes whose MoE takes the
    warpgroup-MMA kernel at 50 tokens (all but the head mode's CUDA-core MoE) the two sets' launches really ran."""
    from deltaserve.kernels.moe import mma_moe

    _, gpu, mode = models
    prompts = _fifty_prompts(13)
    sets, real = [], mma_moe.wg_matmul_experts

    def spy(*args, **kwargs):
        sets.append(kwargs.get("tile_set", (0, 1)))
        return real(*args, **kwargs)

    monkeypatch.setattr(mma_moe, "wg_matmul_experts", spy)
    forked = {graph: decode_logits(gpu, prompts, 4, graph=graph) for graph in (False, True)}
    # whether these blocks take the warpgroup-MMA kernel at 50 tokens (from 16 by default; never in the head mode)
    from deltaserve.kernels.moe.mma_moe import wg_block_tile_rows

    block = next(m for m in gpu.modules() if isinstance(m, SparseMoeBlock))
    mma = fast.state(block).mma
    wg = mma is not None and wg_block_tile_rows(mma, 50 * (block.top_k + 1)) is not None
    assert wg == (mode != "head"), f"{mode}: the warpgroup-MMA experts kernel {'' if wg else 'not '}taken at 50 tokens"
    if wg:
        assert {(0, 2), (1, 2)} <= set(sets), f"{mode}: the MoE's tile sets were not taken ({set(sets)})"
    else:
        assert not sets, f"{mode}: the warpgroup-MMA experts kernel ran ({set(sets)})"
    monkeypatch.setattr(fast, "MOE_HALVES_TOKENS", 0)
    sets.clear()
    joint = decode_logits(gpu, prompts, 4, graph=False)
    assert all(s == (0, 1) for s in sets) and (bool(sets) == wg)
    assert torch.isfinite(joint).all()
    for graph, got in forked.items():
        how = "graph" if graph else "eager"
        assert torch.equal(got, joint), f"{mode}: the MoE's tile sets ({how}) change the logits"


@pytest.mark.parametrize("deployment", [None, "head", "mma"])
def test_verify_equals_decode_steps(models, deployment):
    """Speculative verification on the q4 model in every mode (and each deployment, which fixes the step shape, the
    merge shape and the GEMV family: fast.set_decode_gemv): a verify forward's logits == the decode steps' bit for
    bit, and its commit == decoding the kept rows (verify_helpers.check_verify_equals_decode)."""
    from verify_helpers import check_verify_equals_decode

    if deployment is not None:
        fast.set_decode_gemv(models[1], deployment)
    try:
        check_verify_equals_decode(models[1], torch.bfloat16, "cuda", reference_prefill=False)
    finally:
        fast.set_decode_gemv(models[1], "head")


def test_verify_with_the_step_prep(prep_model, default_paths):
    """The same where the DeltaNet step writes its out projection's prep: the verify step writes it the same way."""
    from verify_helpers import check_verify_equals_decode

    check_verify_equals_decode(prep_model, torch.bfloat16, "cuda", reference_prefill=False)
