"""The integer environment knob helper and the prefill's new switches: defaults, every allowed value, and a clear
error naming the variable for anything else (no Triton launch: these are host-side choices)."""

from __future__ import annotations

import pytest

from deltaserve.kernels.quant import triton_affine as ta
from deltaserve.model import fast
from deltaserve.utils.env import env_int


def check_switch(monkeypatch, name: str, read, default: str, other: str, bad: str) -> None:
    """A choice switch: `default` unset, `other` when set to it, and `bad` refused by an error naming the variable."""
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, other)
    assert read() == other
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=name):
        read()


def test_env_int_default_range_and_errors(monkeypatch):
    monkeypatch.delenv("DELTASERVE_TEST_KNOB", raising=False)
    assert env_int("DELTASERVE_TEST_KNOB", 7) == 7
    monkeypatch.setenv("DELTASERVE_TEST_KNOB", "  ")
    assert env_int("DELTASERVE_TEST_KNOB", 7) == 7  # empty means unset
    monkeypatch.setenv("DELTASERVE_TEST_KNOB", "12")
    assert env_int("DELTASERVE_TEST_KNOB", 7, 1, 12) == 12
    for bad in ("13", "0", "3.5", "many"):
        monkeypatch.setenv("DELTASERVE_TEST_KNOB", bad)
        with pytest.raises(ValueError, match=rf"DELTASERVE_TEST_KNOB must be an integer in \[1, 12\], found '{bad}'"):
            env_int("DELTASERVE_TEST_KNOB", 7, 1, 12)
    monkeypatch.setenv("DELTASERVE_TEST_KNOB", "-1")
    with pytest.raises(ValueError, match="an integer >= 0, found '-1'"):
        env_int("DELTASERVE_TEST_KNOB", 7)


def test_dense_prefill_route_switches(monkeypatch):
    for var in ("DELTASERVE_PREFILL_DENSE", "DELTASERVE_PREFILL_DEQUANT_MIN", "DELTASERVE_DENSE_LOADS",
                "DELTASERVE_PREFILL_FUSED_MAX"):
        monkeypatch.delenv(var, raising=False)
    # the default (lab/NOTES.md): the fused kernel from DEQUANT_MIN_ROWS to FUSED_MAX_ROWS rows, the dequant route
    # above, the wide kernel below
    assert ta.dense_path(ta.DEQUANT_MIN_ROWS) == "fused" and ta.dense_path(ta.DEQUANT_MIN_ROWS - 1) == "wide"
    assert ta.dense_path(ta.FUSED_MAX_ROWS) == "fused" and ta.dense_path(ta.FUSED_MAX_ROWS + 1) == "dequant"
    monkeypatch.setenv("DELTASERVE_PREFILL_DENSE", "dequant")
    assert ta.dense_path(ta.DEQUANT_MIN_ROWS) == "dequant"
    monkeypatch.setenv("DELTASERVE_PREFILL_DEQUANT_MIN", "1")
    assert ta.dense_path(1) == "dequant"
    monkeypatch.setenv("DELTASERVE_PREFILL_DENSE", "wide")
    assert ta.dense_path(4096) == "wide"
    monkeypatch.setenv("DELTASERVE_PREFILL_DENSE", "fused")
    monkeypatch.setenv("DELTASERVE_PREFILL_DEQUANT_MIN", "256")
    assert ta.dense_path(256) == "fused" and ta.dense_path(255) == "wide"
    monkeypatch.setenv("DELTASERVE_PREFILL_FUSED_MAX", "2048")
    assert ta.dense_path(2048) == "fused" and ta.dense_path(2049) == "dequant"
    monkeypatch.delenv("DELTASERVE_PREFILL_FUSED_MAX")
    monkeypatch.setenv("DELTASERVE_PREFILL_DENSE", "cublas")
    with pytest.raises(ValueError, match="DELTASERVE_PREFILL_DENSE must be 'dequant', 'wide' or 'fused', found "
                                         "'cublas'"):
        ta.dense_path(512)
    monkeypatch.delenv("DELTASERVE_PREFILL_DENSE")
    monkeypatch.setenv("DELTASERVE_PREFILL_DEQUANT_MIN", "0")
    with pytest.raises(ValueError, match="DELTASERVE_PREFILL_DEQUANT_MIN must be an integer >= 1"):
        ta.dense_path(512)
    # tiles: TMA by default, 256 x 128 from 2048 rows; cp.async on request; BK always DENSE_BK
    assert ta.dense_config(512) == (128, 64, ta.DENSE_BK, 4, 4, True)
    assert ta.dense_config(4096) == (256, 128, ta.DENSE_BK, 8, 4, True)
    monkeypatch.setenv("DELTASERVE_DENSE_LOADS", "cp.async")
    assert ta.dense_config(4096) == (256, 128, ta.DENSE_BK, 8, 3, False)
    monkeypatch.setenv("DELTASERVE_DENSE_LOADS", "ldg")
    with pytest.raises(ValueError, match="DELTASERVE_DENSE_LOADS"):
        ta.dense_config(512)


def test_prefill_logits_switch(monkeypatch):
    monkeypatch.delenv("DELTASERVE_PREFILL_LOGITS", raising=False)
    assert fast.logits_kernels() == "gemv"  # a prefill's logits rows as a decode step makes them
    monkeypatch.setenv("DELTASERVE_PREFILL_LOGITS", "matmul")
    assert fast.logits_kernels() == "matmul"
    monkeypatch.setenv("DELTASERVE_PREFILL_LOGITS", "cublas")
    with pytest.raises(ValueError, match="DELTASERVE_PREFILL_LOGITS must be 'gemv' or 'matmul'"):
        fast.logits_kernels()


def test_experts_staged_weights_switch(monkeypatch):
    from deltaserve.kernels.quant import mma_gemv as mg

    monkeypatch.delenv("DELTASERVE_MMA_WSTAGE", raising=False)
    # as timed: down from WSTAGE_MIN_ROWS rows through WSTAGE_DOWN slots, the gated form in registers
    assert (mg.default_wstage(4608, True), mg.default_wstage(4608, False)) == (0, mg.WSTAGE_DOWN) == (0, 3)
    assert mg.default_wstage(mg.WSTAGE_MIN_ROWS - 1, False) == 0 and mg.default_wstage(576, False) == 0
    monkeypatch.setenv("DELTASERVE_MMA_WSTAGE", "3,5")
    assert (mg.default_wstage(512, True), mg.default_wstage(512, False)) == (3, 5)
    assert mg.default_wstage(16, True) == 0  # decode-sized launches keep their tuned forms
    for bad in ("3", "1,4", "a,b", "-2,3"):
        monkeypatch.setenv("DELTASERVE_MMA_WSTAGE", bad)
        with pytest.raises(ValueError, match="DELTASERVE_MMA_WSTAGE"):
            mg.default_wstage(512, True)


def test_router_row_blocks_switch(monkeypatch):
    from deltaserve.kernels.moe import triton_decode as md

    monkeypatch.delenv("DELTASERVE_ROUTER_ROW_BLOCKS", raising=False)
    assert md.router_row_blocks() == 1  # one block a program until timed
    monkeypatch.setenv("DELTASERVE_ROUTER_ROW_BLOCKS", "16")
    assert md.router_row_blocks() == 16
    for bad in ("0", "3", "128", "x"):
        monkeypatch.setenv("DELTASERVE_ROUTER_ROW_BLOCKS", bad)
        with pytest.raises(ValueError, match="DELTASERVE_ROUTER_ROW_BLOCKS"):
            md.router_row_blocks()


def test_wgmma_experts_rows_switch(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_MOE_WGMMA_MIN_ROWS", raising=False)
    assert wx.wg_min_rows() == wx.WG_MIN_ROWS == 144  # from 16 tokens: a 16-stream decode, not an 8-stream one
    monkeypatch.delenv("DELTASERVE_MOE_WGMMA_ROWS32", raising=False)
    assert (wx.wg_tile_rows(4096), wx.wg_tile_rows(4095), wx.wg_tile_rows(576)) == (16, 8, 8)
    assert (wx.wg_tile_rows(8192), wx.wg_tile_rows(8191)) == (32, 16)
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_ROWS32", "0")
    assert wx.wg_tile_rows(1 << 20) == 16
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_ROWS32", "-1")
    with pytest.raises(ValueError, match="DELTASERVE_MOE_WGMMA_ROWS32"):
        wx.wg_tile_rows(8)
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_MIN_ROWS", "0")
    assert wx.wg_min_rows() > 1 << 40  # off: no block reaches it
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_MIN_ROWS", "-1")
    with pytest.raises(ValueError, match="DELTASERVE_MOE_WGMMA_MIN_ROWS"):
        wx.wg_min_rows()


def test_experts_skip_empty_switch(monkeypatch):
    from deltaserve.kernels.quant import mma_gemv as mg

    monkeypatch.delenv("DELTASERVE_MMA_SKIP_EMPTY", raising=False)
    assert mg.skip_empty_tiles()
    monkeypatch.setenv("DELTASERVE_MMA_SKIP_EMPTY", "0")
    assert not mg.skip_empty_tiles()
    monkeypatch.setenv("DELTASERVE_MMA_SKIP_EMPTY", "no")
    with pytest.raises(ValueError, match="DELTASERVE_MMA_SKIP_EMPTY"):
        mg.skip_empty_tiles()


def test_wgmma_order_switch(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_WGMMA_ORDER", raising=False)
    assert wx.wg_partial_major()  # partial sum by partial sum: the default since the H200 A/B
    monkeypatch.setenv("DELTASERVE_WGMMA_ORDER", "group")
    assert not wx.wg_partial_major()
    monkeypatch.setenv("DELTASERVE_WGMMA_ORDER", "warp")
    with pytest.raises(ValueError, match="DELTASERVE_WGMMA_ORDER"):
        wx.wg_partial_major()


def test_gdn_step_shape_switch(monkeypatch):
    from deltaserve.kernels.gated_delta import triton_decode as td

    monkeypatch.delenv("DELTASERVE_GDN_STEP", raising=False)
    assert td.step_dv_block() == td.DV_BLOCK == 32  # blocks of 32 state columns: the batch-1 winner
    assert td.step_dv_block(throughput=True) == td.THROUGHPUT_DV_BLOCK == 64  # a tensor-core GEMV deployment's
    monkeypatch.setenv("DELTASERVE_GDN_STEP", "split")
    assert td.step_dv_block(throughput=True) == 32
    monkeypatch.setenv("DELTASERVE_GDN_STEP", "split64")
    assert td.step_dv_block() == 64
    monkeypatch.setenv("DELTASERVE_GDN_STEP", "head")
    assert td.step_dv_block() is None and td.step_dv_block(throughput=True) is None
    monkeypatch.setenv("DELTASERVE_GDN_STEP", "warp")
    with pytest.raises(ValueError, match="DELTASERVE_GDN_STEP must be 'auto', 'split', 'split64' or 'head', "
                                         "found 'warp'"):
        td.step_dv_block()


def test_wg_gemv_dispatch_knobs(monkeypatch):
    """mma_gemv's warpgroup-MMA form: from WG_GEMV_ROWS rows by default (0: never), its tile rows by the rows and
    the weight (64 for the lm_head past 32 rows, 32 past 32 rows or for the lm_head below, else 16) unless pinned,
    its slots; bad values name the variable."""
    from deltaserve.kernels.quant import mma_gemv as mg

    for var in ("DELTASERVE_MMA_GEMV_WG_ROWS", "DELTASERVE_MMA_GEMV_WG_ROWS_K4096", "DELTASERVE_MMA_GEMV_WG_BN",
                "DELTASERVE_MMA_GEMV_WG_NS"):
        monkeypatch.delenv(var, raising=False)
    assert mg.wg_gemv_rows() == mg.WG_GEMV_ROWS == 17
    assert (mg.wg_gemv_tile_rows(32, 772), mg.wg_gemv_tile_rows(64, 772), mg.wg_gemv_tile_rows(32, 15520),
            mg.wg_gemv_tile_rows(64, 15520)) == (16, 32, 32, 64)  # the lm_head past 32 rows: 64
    assert mg.wg_gemv_stages() == 3
    assert mg.wg_gemv_tile_rows(8, 128) == 8
    assert mg.wg_gemv_rows(4096) == mg.WG_GEMV_ROWS_K4096 == 9  # the out projections from 9 rows
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_WG_ROWS_K4096", "1")  # the K = 4096 weights alone from 1 row
    assert (mg.wg_gemv_rows(2048), mg.wg_gemv_rows(4096)) == (17, 1)
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_WG_ROWS", "0")  # never, for every weight
    assert mg.wg_gemv_rows() > 1 << 40 and mg.wg_gemv_rows(4096) > 1 << 40
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_WG_BN", "64")
    assert mg.wg_gemv_tile_rows(17, 772) == 64
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_WG_BN", "12")
    with pytest.raises(ValueError, match="DELTASERVE_MMA_GEMV_WG_BN"):
        mg.wg_gemv_tile_rows(64, 772)
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_WG_NS", "1")
    with pytest.raises(ValueError, match="DELTASERVE_MMA_GEMV_WG_NS"):
        mg.wg_gemv_stages()


def test_wg_gemv_ksplit_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_WG_GEMV_KSPLIT", raising=False)
    # the default: the 4-warp K split in one program, the 8-warp one (K = 4096) over eight; never more than the warps
    assert [wx.wg_gemv_ksplit(w) for w in (1, 2, 4, 8)] == [1, 1, 1, 8]
    monkeypatch.setenv("DELTASERVE_WG_GEMV_KSPLIT", "4,8")
    assert [wx.wg_gemv_ksplit(w) for w in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert [wx.wg_gemv_ksplit(w, 15520) for w in (4, 8)] == [1, 2]  # the lm_head's many row blocks: no further
    # what a split can be: dividing the warps' partial sums, at most four a program
    assert [ks for ks in (0, 1, 2, 3, 4, 8, 16) if wx.wg_ksplit_fits(8, ks)] == [2, 4, 8]
    assert [ks for ks in (0, 1, 2, 3, 4, 8) if wx.wg_ksplit_fits(4, ks)] == [1, 2, 4]
    monkeypatch.setenv("DELTASERVE_WG_GEMV_KSPLIT", "1,0")  # the K = 4096 weights stay on mma_gemv
    assert wx.wg_gemv_ksplit(8) == 0 and wx.wg_gemv_ksplit(4) == 1
    for bad in ("4", "2,3", "x,4", "4,1", "16,4", "0,4", "0,0"):
        monkeypatch.setenv("DELTASERVE_WG_GEMV_KSPLIT", bad)
        with pytest.raises(ValueError, match="DELTASERVE_WG_GEMV_KSPLIT"):
            wx.wg_gemv_ksplit(8)


def test_wgmma_register_cap_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_WGMMA_MAXNREG", raising=False)
    # the default: 96 for 8-row tiles, 128 for 16-row ones, 168 for 32-row ones, none wider
    assert [wx.wg_maxnreg(r) for r in (8, 16, 32, 64)] == [{"maxnreg": 96}, {"maxnreg": 128}, {"maxnreg": 168}, {}]
    # wg_gemv's: none past 16 rows (its 32-row form keeps 125 registers)
    assert [wx.wg_maxnreg(r, dense=True) for r in (8, 16, 32)] == [{"maxnreg": 96}, {"maxnreg": 128}, {}]
    monkeypatch.setenv("DELTASERVE_WGMMA_MAXNREG", "0")
    assert wx.wg_maxnreg(8) == {}
    monkeypatch.setenv("DELTASERVE_WGMMA_MAXNREG", "128")
    assert wx.wg_maxnreg(8) == wx.wg_maxnreg(64) == wx.wg_maxnreg(32, dense=True) == {"maxnreg": 128}
    monkeypatch.setenv("DELTASERVE_WGMMA_MAXNREG", "128@8")
    assert (wx.wg_maxnreg(8), wx.wg_maxnreg(16)) == ({"maxnreg": 128}, {})
    monkeypatch.setenv("DELTASERVE_WGMMA_MAXNREG", "96@8, 128@16")  # the first cap that applies
    assert [wx.wg_maxnreg(r) for r in (8, 16, 32)] == [{"maxnreg": 96}, {"maxnreg": 128}, {}]
    monkeypatch.setenv("DELTASERVE_WGMMA_MAXNREG", "128@16,96@8")
    assert wx.wg_maxnreg(8) == {"maxnreg": 128}
    for bad in ("many", "128@", "8", "96@8,x"):
        monkeypatch.setenv("DELTASERVE_WGMMA_MAXNREG", bad)
        with pytest.raises(ValueError, match="DELTASERVE_WGMMA_MAXNREG"):
            wx.wg_maxnreg(32)


@pytest.mark.parametrize("switch,var,default", [("wg_fold_pair", "DELTASERVE_WGMMA_FOLD", True),
                                                 ("wg_split_wait", "DELTASERVE_WGMMA_SPLIT_WAIT", False)])
def test_wgmma_on_off_switches(monkeypatch, switch, var, default):
    from deltaserve.kernels.quant import wgmma_experts as wx

    fn = getattr(wx, switch)
    monkeypatch.delenv(var, raising=False)
    assert fn() is default
    for value, want in (("1", True), ("0", False)):
        monkeypatch.setenv(var, value)
        assert fn() is want
    for bad in ("yes", "2"):
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValueError, match=var):
            fn()


def test_mma_gemv_row_split_knobs(monkeypatch):
    from deltaserve.kernels.quant import mma_gemv as mg

    for var in ("DELTASERVE_MMA_GEMV_SPLIT_ROWS", "DELTASERVE_MMA_GEMV_SPLIT_MAXNREG"):
        monkeypatch.delenv(var, raising=False)
    # by default the K = 4096 weights past 32 rows, in programs of 32 rows capped at 128 registers
    assert (mg.split_rows(4096, 64), mg.split_rows(4096, 32), mg.split_rows(2048, 64)) == (32, 0, 0)
    assert mg.split_maxnreg() == {"maxnreg": 128}
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_SPLIT_ROWS", "0")
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_SPLIT_MAXNREG", "0")
    assert (mg.split_rows(4096, 64), mg.split_maxnreg()) == (0, {})
    monkeypatch.setenv("DELTASERVE_MMA_GEMV_SPLIT_ROWS", "24")
    with pytest.raises(ValueError, match="DELTASERVE_MMA_GEMV_SPLIT_ROWS must be 16 or 32"):
        mg.split_rows(4096, 64)


def test_moe_wgmma_stages_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_MOE_WGMMA_STAGES", raising=False)
    assert (wx.wg_moe_stages(8), wx.wg_moe_stages(16)) == (5, wx.WG_STAGES)  # the default: 5 slots for 8-row tiles
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_STAGES", "0")
    assert wx.wg_moe_stages(8) == wx.wg_moe_stages(16) == wx.WG_STAGES
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_STAGES", "5@8")
    assert (wx.wg_moe_stages(8), wx.wg_moe_stages(16)) == (5, wx.WG_STAGES)
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_STAGES", "4")
    assert wx.wg_moe_stages(16) == 4
    for bad in ("1", "x", "5@"):
        monkeypatch.setenv("DELTASERVE_MOE_WGMMA_STAGES", bad)
        with pytest.raises(ValueError, match="DELTASERVE_MOE_WGMMA_STAGES"):
            wx.wg_moe_stages(8)


def test_moe_wgmma_down_stages_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_MOE_WGMMA_STAGES", raising=False)
    monkeypatch.delenv("DELTASERVE_MOE_WGMMA_DOWN_STAGES", raising=False)
    assert [wx.wg_moe_down_stages(r) for r in (8, 16)] == [wx.wg_moe_stages(r) for r in (8, 16)]  # unset: the same
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_STAGES", "9@8")
    assert (wx.wg_moe_down_stages(8), wx.wg_moe_down_stages(16)) == (9, wx.WG_STAGES)
    assert wx.wg_moe_stages(8) == 5  # the gated launch keeps its own
    for bad in ("1", "17", "x@8"):
        monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_STAGES", bad)
        with pytest.raises(ValueError, match="DELTASERVE_MOE_WGMMA_DOWN_STAGES"):
            wx.wg_moe_down_stages(8)


def test_wg_gemv_conv_switch(monkeypatch):
    from deltaserve.kernels.quant import mma_gemv as mg

    monkeypatch.delenv("DELTASERVE_WG_GEMV_CONV", raising=False)
    assert mg.wg_gemv_conv() == "epilogue"  # the default (H200: +0.4% at 64 streams)
    monkeypatch.setenv("DELTASERVE_WG_GEMV_CONV", "launch")
    assert mg.wg_gemv_conv() == "launch"
    monkeypatch.setenv("DELTASERVE_WG_GEMV_CONV", "fused")
    with pytest.raises(ValueError, match="DELTASERVE_WG_GEMV_CONV"):
        mg.wg_gemv_conv()


def test_decode_conv_launch_args():
    """The conv's launch arguments the tensor-core GEMVs (mma_gemv, wg_gemv) share: placeholders without a conv,
    else the checked conv's tensors, channels and strides in the kernels' order; a bad conv names the problem."""
    import torch

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


def test_wgmma_xs_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.setenv("DELTASERVE_WGMMA_SLOTS", "mod")
    monkeypatch.delenv("DELTASERVE_WGMMA_XS", raising=False)
    assert wx.wg_xs_smem() is True  # the default (H200: +1.9% at 64 streams)
    monkeypatch.setenv("DELTASERVE_WGMMA_XS", "load")
    assert wx._step_args(False, None, 1) == {} and wx._step_args(False, True, 1) == {"XS_SMEM": True}
    assert wx._step_args(True, True, 1) == {}  # the kernel's own sums: nothing to stage
    monkeypatch.setenv("DELTASERVE_WGMMA_XS", "smem")
    assert wx.wg_xs_smem() is True and wx._step_args(False, None, 1) == {"XS_SMEM": True}
    assert wx._step_args(False, False, 1) == {}
    monkeypatch.setenv("DELTASERVE_WGMMA_XS", "shared")
    with pytest.raises(ValueError, match="DELTASERVE_WGMMA_XS"):
        wx.wg_xs_smem()


def test_wgmma_slots_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_WGMMA_XS", raising=False)
    monkeypatch.delenv("DELTASERVE_WGMMA_SLOTS", raising=False)
    assert wx.wg_slot_carry() is True  # the default (H200: +2.2% more at 64 streams)
    monkeypatch.setenv("DELTASERVE_WGMMA_SLOTS", "mod")
    assert wx._step_args(True, None, 1) == {}
    monkeypatch.setenv("DELTASERVE_WGMMA_SLOTS", "carry")
    assert wx._step_args(True, None, 1) == {"SLOT_CARRY": True}  # any launch, own sums or given
    assert wx._step_args(False, True, 1) == {"XS_SMEM": True, "SLOT_CARRY": True}
    monkeypatch.setenv("DELTASERVE_WGMMA_SLOTS", "ring")
    with pytest.raises(ValueError, match="DELTASERVE_WGMMA_SLOTS"):
        wx.wg_slot_carry()


def test_wgmma_groups_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    for name in ("DELTASERVE_MOE_WGMMA_GROUPS", "DELTASERVE_MOE_WGMMA_DOWN_GROUPS", "DELTASERVE_WG_GEMV_GROUPS"):
        monkeypatch.delenv(name, raising=False)
    # the defaults: the MoE's gated launch at every tile width and every wg_gemv launch in pairs of groups, the
    # MoE's down one group a step
    assert wx.wg_step_groups(8, 32, 4) == 2 and wx.wg_step_groups(16, 32, 4) == 2
    assert wx.wg_step_groups(8, 8, 1, down=True) == 1 and wx.wg_step_groups(16, 8, 1, down=True) == 1
    assert wx.wg_step_groups(64, 32, 4, dense=True) == 2 and wx.wg_step_groups(8, 8, 1, dense=True) == 2
    assert wx.wg_step_groups(8, 12, 4) == 1  # 3 groups a partial sum's run: not in pairs
    assert wx.wg_step_groups(8, 1, 1, dense=True) == 1
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_GROUPS", "2@8")
    assert wx.wg_step_groups(8, 32, 4) == 2 and wx.wg_step_groups(16, 32, 4) == 1
    assert wx.wg_step_groups(16, 8, 1, down=True) == 1  # down reads its own switch only
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_GROUPS", "2")
    assert wx.wg_step_groups(16, 8, 1, down=True) == 2 and wx.wg_step_groups(64, 8, 1, down=True) == 2
    monkeypatch.setenv("DELTASERVE_WG_GEMV_GROUPS", "2@16")  # wider tiles: 1
    assert wx.wg_step_groups(16, 32, 4, dense=True) == 2 and wx.wg_step_groups(32, 32, 4, dense=True) == 1
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_GROUPS", "0")
    assert wx.wg_step_groups(8, 32, 4) == 1 and wx.wg_step_groups(8, 8, 1, down=True) == 2
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_GROUPS", "0")
    assert wx.wg_step_groups(8, 8, 1, down=True) == 1
    monkeypatch.setenv("DELTASERVE_WGMMA_SLOTS", "mod")
    assert wx._step_args(True, None, 2) == {"GS": 2} and wx._step_args(True, None, 1) == {}
    # the same groups in flight in steps of two: 5 slots of one group (4 in flight) = 3 of two
    assert wx._wg_slots(5, 32, 2) == 3 and wx._wg_slots(3, 32, 2) == 2 and wx._wg_slots(5, 32, 1) == 5
    assert wx._wg_slots(5, 2, 2) == 2 and wx._wg_slots(5, 2, 1) == 3  # at most every step in flight
    for name, dense, down in (("DELTASERVE_MOE_WGMMA_GROUPS", False, False),
                              ("DELTASERVE_MOE_WGMMA_DOWN_GROUPS", False, True),
                              ("DELTASERVE_WG_GEMV_GROUPS", True, False)):
        for bad in ("3", "x", "2@y"):
            monkeypatch.setenv(name, bad)
            with pytest.raises(ValueError, match=name):
                wx.wg_step_groups(8, 32, 4, dense, down)
        monkeypatch.delenv(name)


def test_wgmma_down_sets_knob(monkeypatch):
    from deltaserve.kernels.quant import wgmma_experts as wx

    monkeypatch.delenv("DELTASERVE_MOE_WGMMA_DOWN_SETS", raising=False)
    assert wx.wg_row_sets(8) == 2 and wx.wg_row_sets(16) == 2  # the default: two 64-row sets a program
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_SETS", "0")
    assert wx.wg_row_sets(16) == 1
    monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_SETS", "2@8")  # decode-sized tiles only
    assert wx.wg_row_sets(8) == 2 and wx.wg_row_sets(16) == 1
    for bad in ("3", "x", "2@y"):
        monkeypatch.setenv("DELTASERVE_MOE_WGMMA_DOWN_SETS", bad)
        with pytest.raises(ValueError, match="DELTASERVE_MOE_WGMMA_DOWN_SETS"):
            wx.wg_row_sets(8)


def test_attention_kv_early_knob(monkeypatch):
    from deltaserve.kernels.attention import triton_paged as tp

    monkeypatch.delenv("DELTASERVE_ATTN_KV_EARLY", raising=False)
    assert tp.kv_early()
    monkeypatch.setenv("DELTASERVE_ATTN_KV_EARLY", "0")
    assert not tp.kv_early()
    monkeypatch.setenv("DELTASERVE_ATTN_KV_EARLY", "yes")
    with pytest.raises(ValueError, match="DELTASERVE_ATTN_KV_EARLY"):
        tp.kv_early()


def test_conv_early_knob(monkeypatch):
    from deltaserve.kernels.quant import triton_gemv as g

    monkeypatch.delenv("DELTASERVE_CONV_EARLY", raising=False)
    assert g.conv_early()
    monkeypatch.setenv("DELTASERVE_CONV_EARLY", "0")
    assert not g.conv_early()
    monkeypatch.setenv("DELTASERVE_CONV_EARLY", "on")
    with pytest.raises(ValueError, match="DELTASERVE_CONV_EARLY"):
        g.conv_early()


def test_attention_merge_knob(monkeypatch):
    from deltaserve.kernels.attention import triton_paged as tp

    monkeypatch.delenv("DELTASERVE_ATTN_MERGE", raising=False)
    assert tp.merge_shape() == (tp.MERGE_BSP, tp.MERGE_BD) and tp.merge_shape(throughput=True) == (16, 256)
    monkeypatch.setenv("DELTASERVE_ATTN_MERGE", "16x64")
    assert tp.merge_shape() == (16, 64) and tp.merge_shape(throughput=True) == (16, 64)
    for bad in ("16", "12x64", "16x8", "512x32", "ax32"):
        monkeypatch.setenv("DELTASERVE_ATTN_MERGE", bad)
        with pytest.raises(ValueError, match="DELTASERVE_ATTN_MERGE"):
            tp.merge_shape()


def test_attention_long_split_knob(monkeypatch):
    """The decode attention's long rows' splits: off by default (LONG_SPLIT None), FROMxTILES from the env, "off"
    over a module setting, and refusals naming where the bad value came from."""
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
    for bad in ("8192", "x2", "8192x3", f"{tp.SPLIT_TOKENS - 1}x2", "8192x2x2"):
        monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", bad)
        with pytest.raises(ValueError, match="DELTASERVE_ATTN_LONG_SPLIT"):
            tp.long_split()
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", "auto")
    monkeypatch.setattr(tp, "LONG_SPLIT", (8192, 16))
    with pytest.raises(ValueError, match="triton_paged.LONG_SPLIT"):
        tp.long_split()


def test_prefill_attention_launch(monkeypatch):
    """The prefill attention's launch: 4 warps to D 128; past it 8 warps, and 5 pipeline stages only where the device
    has the shared memory for their three K/V buffers (Triton's stages elsewhere: the interpreter, smaller GPUs);
    the env's W,S,P for A/B, refused unless well formed."""
    from deltaserve.kernels.attention import triton_paged as tp

    monkeypatch.delenv("DELTASERVE_PREFILL_ATTN", raising=False)
    monkeypatch.setattr(tp, "_block_smem", lambda device=None: 227 * 1024)  # an H100 / H200
    assert tp.prefill_launch(256) == (8, 5, False) and tp.prefill_launch(128) == (4, None, False)
    monkeypatch.setattr(tp, "_block_smem", lambda device=None: 99 * 1024)  # an RTX 4090
    assert tp.prefill_launch(256) == (8, None, False)
    monkeypatch.setattr(tp, "PREFILL_LAUNCH", (4, 2, True))
    assert tp.prefill_launch(256) == (4, 2, True)
    monkeypatch.setenv("DELTASERVE_PREFILL_ATTN", "8,0,1")
    assert tp.prefill_launch(256) == (8, None, True)
    for bad in ("8,5", "3,5,0", "8,-1,0", "8,5,2", "a,b,c"):
        monkeypatch.setenv("DELTASERVE_PREFILL_ATTN", bad)
        with pytest.raises(ValueError, match="DELTASERVE_PREFILL_ATTN"):
            tp.prefill_launch(256)


def test_route_tiles_mode_and_bad_requests(monkeypatch):
    """The fused routing's switch and its refusals, before any launch: an unknown mode, tiles without the shared
    slot, more tokens than the bitmap's two words, a tile width the experts kernel does not take."""
    import torch

    from deltaserve.kernels.moe import triton_decode as md
    from deltaserve.kernels.moe import triton_route_tiles as rt
    from deltaserve.kernels.triton_common import WeightSpec

    check_switch(monkeypatch, "DELTASERVE_MOE_ROUTE_TILES", rt.route_tiles_mode, "fused", "split", "sorted")
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


def test_router_norm_switches_and_bad_requests(monkeypatch):
    """The router launch's own norm: its switch and token limit (env), and route_normed's refusals before any
    launch (too many tokens, a width that is no power of two, a residual or norm weight of another shape, norm
    together with tiles)."""
    import torch

    from deltaserve.kernels.moe import triton_decode as md

    for name in ("DELTASERVE_ROUTER_NORM", "DELTASERVE_ROUTER_NORM_TOKENS", "DELTASERVE_ROUTER_NORM_READ"):
        monkeypatch.delenv(name, raising=False)
    assert md.router_norm_mode() == "fused" and md.router_norm_tokens() == md.ROUTER_NORM_DECODE_TOKENS == 4
    assert md.router_norm_read() == "scratch"
    monkeypatch.setenv("DELTASERVE_ROUTER_NORM_READ", "tiles")
    assert md.router_norm_read() == "tiles"
    monkeypatch.setenv("DELTASERVE_ROUTER_NORM_READ", "smem")
    with pytest.raises(ValueError, match="DELTASERVE_ROUTER_NORM_READ"):
        md.router_norm_read()
    monkeypatch.setenv("DELTASERVE_ROUTER_NORM", "split")
    assert md.router_norm_mode() == "split"
    monkeypatch.setenv("DELTASERVE_ROUTER_NORM", "inline")
    with pytest.raises(ValueError, match="DELTASERVE_ROUTER_NORM"):
        md.router_norm_mode()
    monkeypatch.setenv("DELTASERVE_ROUTER_NORM_TOKENS", "16")
    assert md.router_norm_tokens() == 16
    monkeypatch.setenv("DELTASERVE_ROUTER_NORM_TOKENS", "17")
    with pytest.raises(ValueError, match="DELTASERVE_ROUTER_NORM_TOKENS"):
        md.router_norm_tokens()
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



def test_norm_tree_switch(monkeypatch):
    """Which norm launches sum x^2 by the pairwise tree: add_rms_norm's (the router launch repeats it) by default,
    every one under DELTASERVE_NORM_TREE=all; an unknown value is refused."""
    from deltaserve.kernels.triton_norm import norm_tree

    monkeypatch.delenv("DELTASERVE_NORM_TREE", raising=False)
    assert norm_tree(True) and not norm_tree(False)
    monkeypatch.setenv("DELTASERVE_NORM_TREE", "all")
    assert norm_tree(True) and norm_tree(False)
    monkeypatch.setenv("DELTASERVE_NORM_TREE", "none")
    with pytest.raises(ValueError, match="DELTASERVE_NORM_TREE"):
        norm_tree(True)


def test_prefill_copies_knob(monkeypatch):
    """The prefill reads column views in place (the gated norm's z, the attention gate in the prefill kernel) by
    default; DELTASERVE_PREFILL_COPIES=torch copies them first (for in-model A/B); an unknown value is refused."""
    from deltaserve.model.fast import prefill_copies

    monkeypatch.delenv("DELTASERVE_PREFILL_COPIES", raising=False)
    assert not prefill_copies()
    monkeypatch.setenv("DELTASERVE_PREFILL_COPIES", "torch")
    assert prefill_copies()
    monkeypatch.setenv("DELTASERVE_PREFILL_COPIES", "copy")
    with pytest.raises(ValueError, match="DELTASERVE_PREFILL_COPIES"):
        prefill_copies()


def test_router_rows_and_tiles_scan_switches(monkeypatch):
    from deltaserve.kernels.moe import gluon_router_rows as grr

    for var in ("DELTASERVE_ROUTER_ROWS_KERNEL", "DELTASERVE_ROUTER_ROWS_SHAPE", "DELTASERVE_MOE_TILES_SCAN"):
        monkeypatch.delenv(var, raising=False)
    assert grr.router_rows_kernel() == "gluon" and grr.rows_launch() == (grr.ROWS_BN, grr.ROWS_MB)
    assert ta.tiles_scan_mode() == "parallel"
    monkeypatch.setenv("DELTASERVE_ROUTER_ROWS_KERNEL", "triton")
    assert grr.router_rows_kernel() == "triton"
    monkeypatch.setenv("DELTASERVE_ROUTER_ROWS_SHAPE", "8,32")
    assert grr.rows_launch() == (8, 32)
    for bad in ("8", "3,16", "32,16", "4,128", "a,b"):
        monkeypatch.setenv("DELTASERVE_ROUTER_ROWS_SHAPE", bad)
        with pytest.raises(ValueError, match="DELTASERVE_ROUTER_ROWS_SHAPE"):
            grr.rows_launch()
    monkeypatch.setenv("DELTASERVE_MOE_TILES_SCAN", "serial")
    assert ta.tiles_scan_mode() == "serial"
    monkeypatch.setenv("DELTASERVE_MOE_TILES_SCAN", "sorted")
    with pytest.raises(ValueError, match="DELTASERVE_MOE_TILES_SCAN"):
        ta.tiles_scan_mode()


def test_prefill_router_switch_and_fit(monkeypatch):
    """DELTASERVE_PREFILL_ROUTER: "mma" by default, "rows" for A/B, anything else refused by name; the tensor-core
    router serves affine routers of 4 / 8 bits in groups of a multiple of 16 on bf16 rows, nothing else."""
    import torch

    from deltaserve.kernels.moe import triton_router_mma as rm
    from deltaserve.kernels.triton_common import WeightSpec

    check_switch(monkeypatch, "DELTASERVE_PREFILL_ROUTER", rm.prefill_router_mode, "mma", "rows", "gluon")
    x = torch.zeros(3, 2048, dtype=torch.bfloat16)
    s = torch.zeros(256, 32, dtype=torch.bfloat16)
    assert rm.router_mma_fits(x, WeightSpec(torch.zeros(256, 512, dtype=torch.int32), s, s, 8, 64))
    assert rm.router_mma_fits(x, WeightSpec(torch.zeros(256, 256, dtype=torch.int32), s, s, 4, 64))
    assert not rm.router_mma_fits(x.float(), WeightSpec(torch.zeros(256, 512, dtype=torch.int32), s, s, 8, 64))
    assert not rm.router_mma_fits(x, WeightSpec(torch.zeros(256, 2048, dtype=torch.bfloat16), None, None, 16, 1))
    assert not rm.router_mma_fits(x[:, :1024], WeightSpec(torch.zeros(256, 512, dtype=torch.int32), s, s, 8, 64))


def test_router_mma_pdl_switch(monkeypatch):
    """DELTASERVE_ROUTER_MMA_PDL: "off" by default, "end" / "early" for A/B, the old "0" refused by name."""
    from deltaserve.kernels.moe import triton_router_mma as rm

    check_switch(monkeypatch, "DELTASERVE_ROUTER_MMA_PDL", rm.router_mma_pdl, "off", "end", "0")
    monkeypatch.setenv("DELTASERVE_ROUTER_MMA_PDL", "early")
    assert rm.router_mma_pdl() == "early"


@pytest.mark.parametrize("bits", [4, 8])
def test_router_codes_copy_switch(monkeypatch, bits):
    """DELTASERVE_ROUTER_MMA_CODES: "bf16" by default, a cached bf16 copy of a packed router's
    codes, each code k of a row from bits (k % PACK) * BITS of word k // PACK, counted by decode_copy_bytes."""
    import torch

    from deltaserve.kernels.moe import triton_router_mma as rm
    from deltaserve.model import fast
    from deltaserve.quant.affine import AffineLinear, AffineSpec

    check_switch(monkeypatch, "DELTASERVE_ROUTER_MMA_CODES", rm.router_mma_codes, "bf16", "words", "fp8")
    gate = AffineLinear(64, 6, AffineSpec(bits, 32))
    words = torch.randint(-2**31, 2**31 - 1, gate.weight.shape, dtype=torch.int64,
                          generator=torch.Generator().manual_seed(bits))
    gate.weight.copy_(words.to(torch.int32).view(torch.uint32))
    monkeypatch.setenv("DELTASERVE_ROUTER_MMA_CODES", "words")
    assert fast.router_codes(gate) is None and fast.decode_copy_bytes(gate) == 0
    monkeypatch.setenv("DELTASERVE_ROUTER_MMA_CODES", "bf16")
    codes = fast.router_codes(gate)
    pack = 32 // bits
    w = gate.weight.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    want = torch.tensor([[(int(w[e, k // pack]) >> (k % pack * bits)) & (2**bits - 1) for k in range(64)]
                         for e in range(6)], dtype=torch.bfloat16)
    assert codes.dtype == torch.bfloat16 and torch.equal(codes, want)
    assert fast.router_codes(gate) is codes  # made once
    assert fast.decode_copy_bytes(gate) == codes.numel() * 2


def test_gluon_router_rows_serves_only_its_format():
    """rows_fit: never on the CPU or in the interpreter (Gluon cannot run there), whatever the router."""
    import torch

    from deltaserve.kernels.moe import gluon_router_rows as grr
    from deltaserve.kernels.triton_common import WeightSpec

    w = torch.zeros(256, 512, dtype=torch.int32)
    s = torch.zeros(256, 32, dtype=torch.bfloat16)
    x = torch.zeros(512, 2048, dtype=torch.bfloat16)
    assert not grr.rows_fit(x, WeightSpec(w, s, s, 8, 64), 32, 4)  # a CPU tensor


def test_initial_states_switch(monkeypatch):
    """DELTASERVE_GDN_INITIAL_STATES: "triton" unset, "torch" for A/B (the same values), anything else refused by
    name."""
    import torch

    from deltaserve.kernels.gated_delta import triton_decode as td

    monkeypatch.setenv("DELTASERVE_GDN_INITIAL_STATES", "numpy")
    with pytest.raises(ValueError, match="DELTASERVE_GDN_INITIAL_STATES"):
        td.initial_states(torch.zeros(2, 1, 2, 2), torch.zeros(1, dtype=torch.int32), torch.zeros(1))
    monkeypatch.setenv("DELTASERVE_GDN_INITIAL_STATES", "torch")  # off the GPU the torch form serves as well
    pool = torch.arange(16.0).view(2, 2, 2, 2)
    got = td.initial_states(pool, torch.tensor([1, 0], dtype=torch.int32), torch.tensor([4, 0]))
    assert torch.equal(got[0], pool[1]) and not got[1].any()


def test_fused_dense_needs_enough_programs(monkeypatch):
    """wgmma_dense.enough_programs: the out projection (N 2048) at 512 rows makes 128 programs (too few), the
    in_proj (N 12352) 772; the env knob moves the bound."""
    from deltaserve.kernels.quant import wgmma_dense as wd

    monkeypatch.delenv("DELTASERVE_WG_DENSE_MIN_PROGRAMS", raising=False)
    monkeypatch.delenv("DELTASERVE_WG_DENSE_ROWS", raising=False)
    assert not wd.enough_programs(512, 2048) and wd.enough_programs(512, 12352) and wd.enough_programs(512, 9216)
    assert not wd.enough_programs(1024, 2048) and wd.enough_programs(1025, 2048)  # 256 programs, then 288
    monkeypatch.setenv("DELTASERVE_WG_DENSE_MIN_PROGRAMS", "100")
    assert wd.enough_programs(512, 2048)
