"""Tensor-parallel layout (model/tp_layout.py) and shard loading algebra (weights/shard.py): which heads, rows and
experts a rank holds, the cut of every placement kind the formats produce, the refusals, and `info`'s per-rank
budget. No process group: everything here is host arithmetic and meta tensors."""

from __future__ import annotations

import pytest
import torch

from deltaserve.cli import main
from deltaserve.model.config import ModelConfig
from deltaserve.model.tp_layout import TPLayout, check_divisible, grouped_heads
from deltaserve.synthetic.presets import get_preset
from deltaserve.weights.formats import CheckpointError, Placement
from deltaserve.weights.shard import LeafSplit, shard_placement


def config(name: str, **text) -> ModelConfig:
    raw = get_preset(name).config
    raw["text_config"].update(text)
    return ModelConfig.from_dict(raw)


def test_grouped_heads_split_or_replicate():
    # 35B-A3B attention: 16 q heads, 2 KV heads
    assert [grouped_heads(16, 2, r, 2) for r in range(2)] == [((0, 8), (0, 1)), ((8, 16), (1, 2))]
    # 4 ranks: each KV head on two ranks, the one its q heads read
    assert [grouped_heads(16, 2, r, 4)[1] for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    # DeltaNet 35B-A3B: 32 value heads read 16 key heads (value head h reads key h // 2)
    assert grouped_heads(32, 16, 3, 8) == ((12, 16), (6, 8))
    # tiny: 4 value heads, 2 key heads, 4 ranks: key head replicated
    assert [grouped_heads(4, 2, r, 4) for r in range(4)] == [((0, 1), (0, 1)), ((1, 2), (0, 1)), ((2, 3), (1, 2)),
                                                            ((3, 4), (1, 2))]


def test_layout_of_35b_a3b_rank_1_of_2():
    c = ModelConfig.from_dict(get_preset("qwen3.6-35b-a3b").config)
    lay = TPLayout(c, 1, 2)
    local = lay.local_config()
    assert (local.num_attention_heads, local.num_key_value_heads) == (8, 1)
    assert (local.linear_num_value_heads, local.linear_num_key_heads) == (16, 8)
    assert (local.moe_intermediate_size, local.shared_expert_intermediate_size, local.num_experts) == (256, 256, 256)
    assert local.conv_dim == 4096 and local.vocab_size == 248320
    q = lay.module_split("layers.3.self_attn.q_proj")
    assert (q.axis, q.full, q.owned) == ("out", 16 * 512, ((8 * 512, 16 * 512),))  # q|gate rows of heads 8..15
    o = lay.module_split("layers.3.self_attn.o_proj")
    assert (o.axis, o.owned) == ("in", ((2048, 4096),))
    qkv = lay.module_split("layers.0.linear_attn.in_proj_qkv")  # [Q 2048; K 2048; V 4096]
    assert qkv.owned == ((1024, 2048), (3072, 4096), (6144, 8192)) and qkv.local == 4096
    assert lay.param_split("layers.0.linear_attn.conv1d.weight").owned == qkv.owned
    assert lay.param_split("layers.0.linear_attn.A_log").owned == ((16, 32),)
    assert lay.module_split("layers.0.linear_attn.in_proj_b").owned == ((16, 32),)
    assert lay.module_split("layers.0.mlp.experts").owned == ((256, 512),)
    assert lay.module_split("layers.0.mlp.shared_expert.down_proj").axis == "in"
    assert lay.module_split("lm_head").owned == ((124160, 248320),)
    assert lay.module_split("layers.0.mlp.gate") is None
    ep = TPLayout(c, 1, 2, expert_parallel=True)
    assert ep.module_split("layers.0.mlp.experts").owned == ((128, 256),)
    assert ep.local_config().moe_intermediate_size == 512
    with pytest.raises(ValueError, match="does not know how to split module 'mtp.layers.0.fc'"):
        lay.module_split("mtp.layers.0.fc")


@pytest.mark.parametrize("name, size, ep, message", [
    ("tiny-dense", 4, False, "linear_num_value_heads = 2 is not a multiple of 4"),
    ("tiny-moe", 3, False, "num_attention_heads = 4 is not a multiple of 3"),
    ("tiny-moe", 8, True, "num_attention_heads = 4 is not a multiple of 8"),
])
def test_sizes_that_do_not_divide_are_named(name, size, ep, message):
    with pytest.raises(ValueError, match=message):
        TPLayout(config(name), 0, size, ep)


def test_kv_heads_must_divide_or_be_divided():
    with pytest.raises(ValueError, match="num_key_value_heads = 3 neither is a multiple of 2 nor divides it"):
        check_divisible(config("tiny-moe", num_attention_heads=6, num_key_value_heads=3), 2)


def test_expert_parallel_needs_a_moe_model():
    with pytest.raises(ValueError, match="needs a MoE model"):
        TPLayout(config("tiny-dense"), 0, 2, expert_parallel=True)


# ---- the cut of each placement kind -----------------------------------------------------------------------------


def cut(p: Placement, split: LeafSplit, file_shape) -> tuple[tuple, torch.Tensor | None]:
    """(local index, the file tensor after the cut transform) of a placement, on a tensor numbered 0..n-1."""
    q = shard_placement(p, split, "test")
    if q is None:
        return None, None
    t = torch.arange(torch.Size(file_shape).numel()).reshape(file_shape)
    return q.index, (q.transform(t) if q.transform is not None else t)


def test_whole_parameter_rows_in_several_ranges():
    # in_proj_qkv of a [Q 4; K 4; V 8] projection, the rank holding rows 2-3, 6-7, 12-15
    split = LeafSplit(0, 16, ((2, 4), (6, 8), (12, 16)))
    index, t = cut(Placement("w"), split, (16, 3))
    assert index == () and t[:, 0].tolist() == [6, 9, 18, 21, 36, 39, 42, 45]


def test_per_expert_gate_and_up_rows_of_the_fused_gate_up():
    # gate_up [E, 2I, H] with I = 4, rank 1 of 2 holds intermediate rows 2..3 of gate and of up
    split = LeafSplit(1, 8, ((2, 4), (6, 8)))
    index, t = cut(Placement("gu", (5, slice(0, 4))), split, (4, 3))  # expert 5's gate_proj [I, H]
    assert index == (5, slice(0, 2)) and t[:, 0].tolist() == [6, 9]
    index, t = cut(Placement("gu", (5, slice(4, 8))), split, (4, 3))  # its up_proj
    assert index == (5, slice(2, 4)) and t[:, 0].tolist() == [6, 9]


def test_per_expert_down_columns():
    split = LeafSplit(2, 4, ((2, 4),))  # down_proj [E, H, I]: input columns 2..3
    index, t = cut(Placement("down", (1,)), split, (3, 4))
    assert index == (1,) and t.tolist() == [[2, 3], [6, 7], [10, 11]]


def test_expert_parallel_keeps_its_experts_and_sets_the_others_aside():
    split = LeafSplit(0, 8, ((4, 8),))
    assert cut(Placement("w", (6,)), split, (2, 2))[0] == (2,)  # expert 6 is local expert 2, tensor untouched
    assert shard_placement(Placement("w", (3,)), split, "test") is None  # another rank's expert
    index, t = cut(Placement("w"), split, (8, 2))  # stacked [E, ...] in one tensor
    assert index == () and t[:, 0].tolist() == [8, 10, 12, 14]


def test_transform_runs_before_the_cut():
    split = LeafSplit(0, 4, ((2, 4),))
    p = Placement("w", transform=lambda w: w.transpose(0, 1), note="transposed")
    index, t = cut(p, split, (3, 4))
    assert index == () and t.tolist() == [[2, 6, 10], [3, 7, 11]]


def test_packed_rank_share_off_a_group_boundary_is_named(tmp_path):
    from deltaserve.synthetic.quantized import write_quantized_synthetic
    from deltaserve.weights.loader import load_checkpoint
    from parallel_helpers import ThreadGroup

    path = write_quantized_synthetic(tmp_path / "q4", "tiny-moe", "q4", progress=False)  # group 64
    with pytest.raises(CheckpointError, match=r"tensor 'layers\.0\.linear_attn\.out_proj\.scales': tensor-parallel "
                       r"rank 0 of 2 holds features \[0, 32\) of 64, which do not fall on the boundaries of MLX "
                       r"affine groups of 64"):
        load_checkpoint(path, progress=False, parallel=ThreadGroup(2).parallel(0))


# ---- info ---------------------------------------------------------------------------------------------------------


def test_info_prints_the_per_rank_budget_of_397b_q4(capsys):
    rows = {}
    for n in (2, 4, 8):
        assert main(["info", "--preset", "qwen3.5-397b-a17b", "--quant", "q4", "--tensor-parallel-size", str(n)]) == 0
        out = capsys.readouterr().out
        assert f"tensor parallel {n}: the table is ONE rank's share" in out
        total = next(line for line in out.splitlines() if "total (text model)" in line)
        rows[n] = float(total.split("GB")[0].split()[-1])
        assert "15.36 KB of KV per token" in out  # one KV head per rank at every N (2 KV heads, replicated)
    assert 105 < rows[2] < 115 and rows[4] == pytest.approx(rows[2] / 2, rel=0.02)
    assert rows[8] == pytest.approx(rows[2] / 4, rel=0.03)
    main(["info", "--preset", "qwen3.5-397b-a17b", "--quant", "q4", "--tensor-parallel-size", "2"])
    out = capsys.readouterr().out
    assert "on 2 x H100 80GB: does not fit" in out and "on 2 x H200 141GB: " in out and "tokens of KV" in out


def test_info_refuses_a_size_that_does_not_divide(capsys):
    assert main(["info", "--preset", "tiny-dense", "--tensor-parallel-size", "4"]) == 2
    assert "linear_num_value_heads = 2 is not a multiple of 4" in capsys.readouterr().err


def test_llm_checks_the_parallel_options_before_starting_anything(tmp_path):
    from deltaserve.engine.llm import LLM
    from deltaserve.synthetic import make_checkpoint

    path = make_checkpoint(tmp_path / "c", "tiny-moe", config_only=True, progress=False)  # no weights: never read
    with pytest.raises(ValueError, match="enable_expert_parallel .* needs tensor_parallel_size > 1"):
        LLM(path, enable_expert_parallel=True)
    with pytest.raises(ValueError, match="distributed_executor_backend 'ray' is not supported"):
        LLM(path, tensor_parallel_size=2, distributed_executor_backend="ray")
    with pytest.raises(ValueError, match="tensor_parallel_size 3 cannot split"):
        LLM(path, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="speculative_tokens with tensor_parallel_size > 1 is not supported"):
        LLM(path, tensor_parallel_size=2, speculative_tokens=1)
