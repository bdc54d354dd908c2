"""The kernels' launch policy as functions of shape (never of the batch): the tuned values each host-side choice
returns, and the refusals that need no launch. What each value won against is in the docstrings and lab/NOTES.md;
the losing alternatives were deleted (git keeps them)."""

from __future__ import annotations

import pytest
import torch

from deltaserve.kernels.quant import triton_affine as ta


def test_dense_prefill_route():
    from deltaserve.kernels import launch_table

    # the fused kernel from affine.dequant_min_rows to affine.fused_max_rows rows, the dequant route above, the wide
    # kernel below
    lo, hi = launch_table.value("affine.dequant_min_rows"), launch_table.value("affine.fused_max_rows")
    assert (lo, hi) == (256, 1024)
    assert ta.dense_path(lo) == "fused" and ta.dense_path(lo - 1) == "wide"
    assert ta.dense_path(hi) == "fused" and ta.dense_path(hi + 1) == "dequant"
    # tiles by TMA, 256 x 128 from 2048 rows; BK always affine.dense_bk (64)
    assert ta.dense_config(512) == (128, 64, 64, 4, 4, True) and ta.dense_config(2047)[:2] == (128, 64)
    assert ta.dense_config(4096) == (256, 128, 64, 8, 4, True) and ta.dense_config(2048)[:2] == (256, 128)


def test_experts_kernel_policy():
    from deltaserve.kernels import launch_table
    from deltaserve.kernels.moe import mma_experts as mx

    # down from moe_mma.wstage_min_rows rows through moe_mma.wstage_down slots, the gated form in registers
    min_rows = launch_table.value("moe_mma.wstage_min_rows")
    assert (mx.default_wstage(4608, True), mx.default_wstage(4608, False)) == (0, 3) and min_rows == 1024
    assert mx.default_wstage(min_rows - 1, False) == 0 and mx.default_wstage(576, False) == 0
    assert mx.default_wstage(16, True) == 0 and mx.skip_empty_tiles()
    assert (mx.default_ahead(1, True), mx.default_ahead(1, False), mx.default_ahead(64, True)) == (4, 7, 2)
    assert (mx.default_tile_rows(8, 256), mx.default_tile_rows(512, 256)) == (1, 8)


def test_wgmma_experts_policy():
    from deltaserve.kernels import launch_table
    from deltaserve.kernels.moe import wgmma_experts as wx
    from deltaserve.kernels.quant import wgmma_gemv as wg

    assert wx.wg_min_rows() == launch_table.value("moe_wgmma.min_rows") == 144  # 16 tokens: 16-stream decodes, not 8
    assert (wx.wg_tile_rows(4096), wx.wg_tile_rows(4095), wx.wg_tile_rows(576)) == (16, 8, 8)
    assert (wx.wg_tile_rows(8192), wx.wg_tile_rows(8191)) == (32, 16)
    assert wg.wg_partial_major() and wg.wg_fold_pair()
    assert wg.wg_xs_smem() and wg.wg_slot_carry()
    # register caps: 96 for 8-row tiles, 128 for 16-row ones, 168 for 32-row ones, none wider; wg_gemv none past 16
    assert [wg.wg_maxnreg(r) for r in (8, 16, 32, 64)] == [{"maxnreg": 96}, {"maxnreg": 128}, {"maxnreg": 168}, {}]
    assert [wg.wg_maxnreg(r, dense=True) for r in (8, 16, 32)] == [{"maxnreg": 96}, {"maxnreg": 128}, {}]
    assert (wx.wg_moe_stages(8), wx.wg_moe_stages(16)) == (5, launch_table.value("gemv_wgmma.stages"))  # 5 for 8 rows
    assert [wx.wg_moe_down_stages(r) for r in (8, 16)] == [wx.wg_moe_stages(r) for r in (8, 16)]
    # the MoE's gated launch and wg_gemv in pairs of groups, the MoE's down one group a step
    assert wg.wg_step_groups(8, 32, 4) == 2 and wg.wg_step_groups(16, 32, 4) == 2
    assert wg.wg_step_groups(8, 8, 1, down=True) == 1 and wg.wg_step_groups(16, 8, 1, down=True) == 1
    assert wg.wg_step_groups(64, 32, 4, dense=True) == 2 and wg.wg_step_groups(8, 8, 1, dense=True) == 2
    assert wg.wg_step_groups(8, 12, 4) == 1  # 3 groups a partial sum's run: not in pairs
    assert wg.wg_step_groups(8, 1, 1, dense=True) == 1
    assert wx.wg_row_sets(8) == 2 and wx.wg_row_sets(16) == 2  # two 64-row sets a program
    # the same groups in flight in steps of two: 5 slots of one group (4 in flight) = 3 of two
    assert wg._wg_slots(5, 32, 2) == 3 and wg._wg_slots(3, 32, 2) == 2 and wg._wg_slots(5, 32, 1) == 5
    assert wg._wg_slots(5, 2, 2) == 2 and wg._wg_slots(5, 2, 1) == 3  # at most every step in flight
    # the K split: the 4-warp one in one program, the 8-warp one (K = 4096) over eight; never more than the warps
    assert [wg.wg_gemv_ksplit(w) for w in (1, 2, 4, 8)] == [1, 1, 1, 8]
    assert [wg.wg_gemv_ksplit(w, 15520) for w in (4, 8)] == [1, 2]  # the lm_head's many row blocks: no further
    assert [ks for ks in (0, 1, 2, 3, 4, 8, 16) if wg.wg_ksplit_fits(8, ks)] == [2, 4, 8]
    assert [ks for ks in (0, 1, 2, 3, 4, 8) if wg.wg_ksplit_fits(4, ks)] == [1, 2, 4]


def test_tensor_core_gemv_policy():
    from deltaserve.kernels import launch_table
    from deltaserve.kernels.quant import mma_gemv as mg

    from deltaserve.kernels.quant import tensor_core_gemv as tcg

    assert tcg.wg_gemv_rows() == launch_table.value("gemv_tc.wg_gemv_rows") == 17
    assert tcg.wg_gemv_rows(4096) == launch_table.value("gemv_tc.wg_gemv_rows", K=4096) == 9
    assert tcg.wg_gemv_rows(8192) == 9  # a K past 4096 reads the K=4096 value
    assert (tcg.wg_gemv_tile_rows(32, 772), tcg.wg_gemv_tile_rows(64, 772), tcg.wg_gemv_tile_rows(32, 15520),
            tcg.wg_gemv_tile_rows(64, 15520)) == (16, 32, 32, 64)  # the lm_head past 32 rows: 64
    assert tcg.wg_gemv_stages() == 3 and tcg.wg_gemv_tile_rows(8, 128) == 8
    # the K = 4096 weights past 32 rows, in programs of 32 rows capped at 128 registers
    assert (mg.split_rows(4096, 64), mg.split_rows(4096, 32), mg.split_rows(2048, 64)) == (32, 0, 0)
    assert mg.split_maxnreg() == {"maxnreg": 128}


def test_deltanet_and_attention_shapes_by_deployment(monkeypatch):
    from deltaserve.kernels.attention import triton_paged as tp
    from deltaserve.kernels.gated_delta import triton_decode as td

    assert td.step_dv_block() == 32  # blocks of 32 state columns: the batch-1 winner
    assert td.step_dv_block(throughput=True) == 64  # a tensor-core GEMV deployment's
    assert tp.merge_shape() == (128, 32) and tp.merge_shape(throughput=True) == (16, 256)
    assert tp.split_tokens() == 64
    # the prefill attention: 4 warps to D 128; past it 8 warps, and 5 pipeline stages only where the device has the
    # shared memory for their three K/V buffers (Triton's stages elsewhere: the interpreter, smaller GPUs)
    monkeypatch.setattr(tp, "_block_smem", lambda device=None: 227 * 1024)  # an H100 / H200
    assert tp.prefill_launch(256) == (8, 5) and tp.prefill_launch(128) == (4, None)
    monkeypatch.setattr(tp, "_block_smem", lambda device=None: 99 * 1024)  # an RTX 4090
    assert tp.prefill_launch(256) == (8, None)
    monkeypatch.setattr(tp, "PREFILL_LAUNCH", (4, 2))
    assert tp.prefill_launch(256) == (4, 2)


def test_attention_long_split_experiment(monkeypatch):
    """The decode attention's long rows' splits (an experiment, utils/tuning.py): off by default (LONG_SPLIT None),
    FROMxTILES from the environment, "off" over a module setting, and refusals naming where the bad value came
    from."""
    from deltaserve.kernels.attention import triton_paged as tp

    monkeypatch.delenv("DELTASERVE_ATTN_LONG_SPLIT", raising=False)
    assert tp.LONG_SPLIT is None and tp.long_split() is None
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", "8192x4")
    assert tp.long_split() == (8192, 4)
    monkeypatch.setattr(tp, "LONG_SPLIT", (4096, 2))
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", "auto")
    assert tp.long_split() == (4096, 2)
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", "off")
    assert tp.long_split() is None
    for bad in ("8192", "x2", "8192x3", f"{tp.split_tokens() - 1}x2", "8192x2x2"):
        monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", bad)
        with pytest.raises(ValueError, match="DELTASERVE_ATTN_LONG_SPLIT"):
            tp.long_split()
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", "auto")
    monkeypatch.setattr(tp, "LONG_SPLIT", (8192, 16))
    with pytest.raises(ValueError, match="triton_paged.LONG_SPLIT"):
        tp.long_split()


def test_router_policy_and_experiments(monkeypatch):
    from deltaserve.kernels import launch_table
    from deltaserve.kernels.moe import gluon_router_rows as grr
    from deltaserve.kernels.moe import triton_decode as md

    assert md.router_norm_tokens() == launch_table.value("router.norm_tokens") == 4 and md.router_rows_min() == 128
    assert grr.rows_launch() == (launch_table.value("router.rows_bn"), launch_table.value("router.rows_mb")) == (8, 16)
    assert md.topk_warps() == launch_table.value("router.topk_warps")
    monkeypatch.delenv("DELTASERVE_ROUTER_ROW_BLOCKS", raising=False)
    assert md.router_row_blocks() == 1  # one block a program until timed
    monkeypatch.setenv("DELTASERVE_ROUTER_ROW_BLOCKS", "16")
    assert md.router_row_blocks() == 16
    for bad in ("0", "3", "128", "x"):
        monkeypatch.setenv("DELTASERVE_ROUTER_ROW_BLOCKS", bad)
        with pytest.raises(ValueError, match="DELTASERVE_ROUTER_ROW_BLOCKS"):
            md.router_row_blocks()
    assert md.router_norm_read() == "scratch"
    from deltaserve.kernels.moe import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_WGMMA_SPLIT_WAIT", raising=False)
    assert wx.wg_split_wait() is False  # an experiment, off until measured in the model
    monkeypatch.setenv("DELTASERVE_WGMMA_SPLIT_WAIT", "1")
    assert wx.wg_split_wait() is True


def test_route_tiles_bad_requests():
    """The fused routing's refusals, before any launch: tiles without the shared slot, more tokens than the bitmap's two words, a tile width the experts kernel does not take."""
    from deltaserve.kernels.moe import triton_decode as md
    from deltaserve.kernels.moe import triton_route_tiles as rt
    from deltaserve.kernels.triton_common import WeightSpec

    assert rt.route_tiles_fit(64, 257) and not rt.route_tiles_fit(65, 257) and not rt.route_tiles_fit(0, 257)
    router = torch.zeros(8, 64, dtype=torch.bfloat16)
    gate = torch.zeros(1, 64, dtype=torch.bfloat16)
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="tile_rows needs shared_slot"):
        md.moe_route(x, router, 2, True, gate, tile_rows=8)
    r, g = WeightSpec.dense(router, "router"), WeightSpec.dense(gate, "shared gate")
    with pytest.raises(ValueError, match="do not fit the fused launch"):
        rt.route_with_tiles(torch.zeros(65, 64, dtype=torch.bfloat16), r, g, 2, True, 8, 8, md.merged_config(None))
    with pytest.raises(ValueError, match="rows per tile must be 8, 16, 32 or 64, found 12"):
        rt.route_with_tiles(x, r, g, 2, True, 8, 12, md.merged_config(None))


def test_router_norm_bad_requests():
    """route_normed's refusals before any launch (too many tokens, a width that is no power of two, a residual or
    norm weight of another shape, norm together with tiles)."""
    from deltaserve.kernels.moe import triton_decode as md

    assert md.route_normed_fits(16, 2048) and not md.route_normed_fits(17, 2048)
    assert not md.route_normed_fits(1, 96) and not md.route_normed_fits(0, 64)
    router, gate = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(1, 64, dtype=torch.bfloat16)
    x, w = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.bfloat16)
    for args, msg in (((torch.zeros(17, 64, dtype=torch.bfloat16),) * 2 + (w,), "17 tokens of 64 features"),
                      ((torch.zeros(1, 96, dtype=torch.bfloat16),) * 2 + (torch.zeros(96),), "1 tokens of 96"),
                      ((x, x[:2], w), "residual \\(2, 64\\)"), ((x, x, w[:32]), "norm weight \\(32,\\)")):
        with pytest.raises(ValueError, match=msg):
            md.route_normed(*args, 1e-6, 1.0, router, 2, True, gate)
    with pytest.raises(ValueError, match="without tiles"):
        md.moe_route(x, router, 2, True, gate, shared_slot=7, tile_rows=8, norm=(x, w, 1e-6, 1.0, ()))


def test_prefill_router_fit():
    """The tensor-core prefill router serves affine routers of 4 / 8 bits in groups of a multiple of 16 on bf16
    rows, nothing else."""
    from deltaserve.kernels.moe import triton_router_mma as rm
    from deltaserve.kernels.triton_common import WeightSpec

    x = torch.zeros(3, 2048, dtype=torch.bfloat16)
    s = torch.zeros(256, 32, dtype=torch.bfloat16)
    assert rm.router_mma_fits(x, WeightSpec(torch.zeros(256, 512, dtype=torch.int32), s, s, 8, 64))
    assert rm.router_mma_fits(x, WeightSpec(torch.zeros(256, 256, dtype=torch.int32), s, s, 4, 64))
    assert not rm.router_mma_fits(x.float(), WeightSpec(torch.zeros(256, 512, dtype=torch.int32), s, s, 8, 64))
    assert not rm.router_mma_fits(x, WeightSpec(torch.zeros(256, 2048, dtype=torch.bfloat16), None, None, 16, 1))
    assert not rm.router_mma_fits(x[:, :1024], WeightSpec(torch.zeros(256, 512, dtype=torch.int32), s, s, 8, 64))


@pytest.mark.parametrize("bits", [4, 8])
def test_router_codes_copy(bits):
    """The tensor-core prefill router's cached bf16 copy of a packed router's codes: each code k of a row from bits (k % PACK) * BITS of word k // PACK, counted by decode_copy_bytes."""
    from deltaserve.model import fast
    from deltaserve.quant.affine import AffineLinear, AffineSpec

    gate = AffineLinear(64, 6, AffineSpec(bits, 32))
    words = torch.randint(-2**31, 2**31 - 1, gate.weight.shape, dtype=torch.int64,
                          generator=torch.Generator().manual_seed(bits))
    gate.weight.copy_(words.to(torch.int32).view(torch.uint32))
    assert fast.decode_copy_bytes(gate) == 0
    codes = fast.router_codes(gate)
    pack = 32 // bits
    w = gate.weight.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    want = torch.tensor([[(int(w[e, k // pack]) >> (k % pack * bits)) & (2**bits - 1) for k in range(64)]
                         for e in range(6)], dtype=torch.bfloat16)
    assert codes.dtype == torch.bfloat16 and torch.equal(codes, want)
    assert fast.router_codes(gate) is codes  # made once
    assert fast.decode_copy_bytes(gate) == codes.numel() * 2


def test_initial_states_torch_form():
    """The prefill's initial states where the one launch cannot serve (a non-contiguous pool): torch's gather and
    where, the same values (the state of a continued sequence, zeros for a fresh one)."""
    from deltaserve.kernels.gated_delta import triton_decode as td

    pool = torch.arange(32.0).view(2, 2, 2, 4)[..., ::2]  # not contiguous
    got = td.initial_states(pool, torch.tensor([1, 0], dtype=torch.int32), torch.tensor([4, 0]))
    assert torch.equal(got[0], pool[1]) and not got[1].any()


def test_fused_dense_needs_enough_programs():
    """wgmma_dense.enough_programs: the out projection (N 2048) at 512 rows makes 128 programs (too few), the
    in_proj (N 12352) 772."""
    from deltaserve.kernels import launch_table
    from deltaserve.kernels.quant import wgmma_dense as wd

    assert not wd.enough_programs(512, 2048) and wd.enough_programs(512, 12352) and wd.enough_programs(512, 9216)
    assert not wd.enough_programs(1024, 2048) and wd.enough_programs(1025, 2048)  # 256 programs, then 288
    assert wd.dense_tile_rows() == launch_table.value("dense_wgmma.tile_rows") and wd.dense_maxnreg() == {}


def test_decode_conv_launch_args():
    """The conv's launch arguments the tensor-core GEMVs (mma_gemv, wg_gemv) share: placeholders without a conv,
    else the checked conv's tensors, channels and strides in the kernels' order; a bad conv names the problem."""
    from deltaserve.kernels.quant.mma_gemv import decode_conv_args

    x = torch.zeros(3, 8)
    assert decode_conv_args(None, 3, 16, torch.bfloat16, x) == (4, (x, x, x, x, 0, 0, 0, 0, 0, 0))
    w = torch.zeros(4, 1, 4, dtype=torch.bfloat16)[:, 0, :]
    pool = torch.zeros(5, 4, 3, dtype=torch.bfloat16)
    slots, ctx = torch.arange(3), torch.zeros(3, dtype=torch.int32)
    kconv, args = decode_conv_args((w, pool, slots, ctx, 4), 3, 16, torch.bfloat16, x)
    assert kconv == 4 and args[:5] == (w, pool, slots, ctx, 4) and args[5:] == (*w.stride(), *pool.stride())
    with pytest.raises(ValueError, match="3 rows .* but 2 slots"):
        decode_conv_args((w, pool, slots[:2], ctx[:2], 4), 3, 16, torch.bfloat16, x)


def test_gluon_router_rows_serves_only_its_format():
    """rows_fit: never on the CPU or in the interpreter (Gluon cannot run there), whatever the router."""
    from deltaserve.kernels.moe import gluon_router_rows as grr
    from deltaserve.kernels.triton_common import WeightSpec

    w = torch.zeros(256, 512, dtype=torch.int32)
    s = torch.zeros(256, 32, dtype=torch.bfloat16)
    x = torch.zeros(512, 2048, dtype=torch.bfloat16)
    assert not grr.rows_fit(x, WeightSpec(w, s, s, 8, 64), 32, 4)  # a CPU tensor
