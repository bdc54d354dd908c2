"""The GGUF tensor plan of a Qwen3.5/3.6 model: llama.cpp's `qwen35moe` / `qwen35` names, shapes and conversions.

`gguf_plan(config)` lists every tensor llama.cpp loads for the text model, each with the parameter of our model
(`Qwen3_5ForCausalLM` names: the published names minus `model.language_model.`) it is made from and the conversion
that turns that parameter into the GGUF tensor (spec sections 2.5 and 4.2):

- every zero-centred RMSNorm weight gets the +1 baked in (llama.cpp applies norms as x_hat * w); the DeltaNet
  `linear_attn.norm.weight` is applied as w already and is copied unchanged;
- ssm_a = -exp(A_log); dt_bias becomes `ssm_dt.bias`; conv1d [C, 1, K] is squeezed to [C, K];
- when Hv != Hk the value heads are re-ordered from "grouped by key head" (value head h uses key head h // r) to
  "tiled" (value head h uses key head h % Hk), so ggml can broadcast Q/K by plain repetition: the V rows of
  in_proj_qkv, the rows of in_proj_z, in_proj_a/b, A_log, dt_bias, the V channels of conv1d and the input columns
  of out_proj all move together, so the model computes the same function;
- routed experts: the fused gate_up_proj [E, 2I, H] (gate rows first) is split into ffn_gate_exps and ffn_up_exps
  [E, I, H] (or kept fused as ffn_gate_up_exps, which llama.cpp also reads); down_proj [E, H, I] -> ffn_down_exps.

Shapes are torch order (rows along the last dim); GGUF stores them reversed (ggml ne). The MTP head (`mtp.*`) and
the vision tower are not exported: llama.cpp's text graph does not run them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..model.config import ModelConfig

ARCH = {"qwen3_5_moe": "qwen35moe", "qwen3_5": "qwen35"}

# Roles decide the stored type: matrices follow --type, norms/vectors/routers/conv kernels stay F32 (as
# convert_hf_to_gguf.py and llama-quantize keep them), the output head gets its own type (Q6_K in q4_k_m).
MATRIX, EMBED, OUTPUT, NORM, VECTOR, ROUTER, CONV = "matrix", "embed", "output", "norm", "vector", "router", "conv"
F32_ROLES = (NORM, VECTOR, ROUTER, CONV)

Convert = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GGUFTensor:
    name: str  # GGUF name, e.g. blk.0.attn_qkv.weight
    shape: tuple[int, ...]  # torch order: rows along the last dim
    role: str
    source: str  # our parameter it is made from
    convert: Convert | None = None  # our parameter (float32) -> this tensor; None = as is
    std: float = 0.0  # random mode: weight scale of a matrix (1/sqrt(fan_in))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ExportError(ValueError):
    """A checkpoint or configuration the exporter cannot write (message names what and why)."""


def arch_of(config: ModelConfig) -> str:
    if config.model_type not in ARCH:
        raise ExportError(
            f"model_type {config.model_type!r} has no GGUF export here; supported: {', '.join(ARCH)} "
            f"(llama.cpp archs {', '.join(ARCH.values())})"
        )
    return ARCH[config.model_type]


def _check_dims(config: ModelConfig) -> None:
    # llama.cpp's qwen35 graphs take one head size for keys and values of the DeltaNet (ssm.state_size).
    if config.linear_key_head_dim != config.linear_value_head_dim:
        raise ExportError(
            f"llama.cpp's {arch_of(config)} needs linear_key_head_dim == linear_value_head_dim, found "
            f"{config.linear_key_head_dim} and {config.linear_value_head_dim}"
        )
    if config.linear_num_value_heads % config.linear_num_key_heads:
        raise ExportError(
            f"linear_num_value_heads {config.linear_num_value_heads} is not a multiple of linear_num_key_heads "
            f"{config.linear_num_key_heads}"
        )


# ---- conversions ---------------------------------------------------------------------------------------------------
def tile_v_heads(t: torch.Tensor, dim: int, hk: int, r: int, head: int) -> torch.Tensor:
    """Re-order `dim` (length hk*r*head) from grouped [hk, r, head] to tiled [r, hk, head]."""
    shape = list(t.shape)
    dim %= t.dim()
    split = shape[:dim] + [hk, r, head] + shape[dim + 1 :]
    return t.reshape(split).transpose(dim, dim + 1).contiguous().reshape(shape)


def _plus_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1.0


class _VHeads:
    """The value-head re-ordering of one config (identity when Hv == Hk)."""

    def __init__(self, config: ModelConfig):
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.r, self.dv, self.key_dim = self.hv // self.hk, config.linear_value_head_dim, config.key_dim

    def rows(self, head: int) -> Convert | None:
        if self.r == 1:
            return None
        return lambda t: tile_v_heads(t, 0, self.hk, self.r, head)

    def qkv_rows(self, t: torch.Tensor) -> torch.Tensor:  # [2*key_dim + value_dim, ...]: only the V part moves
        if self.r == 1:
            return t
        qk, v = t[: 2 * self.key_dim], t[2 * self.key_dim :]
        return torch.cat([qk, tile_v_heads(v, 0, self.hk, self.r, self.dv)], 0)

    def a_log(self, t: torch.Tensor) -> torch.Tensor:
        t = -torch.exp(t)
        return t if self.r == 1 else tile_v_heads(t, 0, self.hk, self.r, 1)

    def conv(self, t: torch.Tensor) -> torch.Tensor:  # [C, 1, K] -> [C, K]
        return self.qkv_rows(t.reshape(t.shape[0], t.shape[-1]))

    def out_cols(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.r == 1 else tile_v_heads(t, 1, self.hk, self.r, self.dv)


# ---- the plan ------------------------------------------------------------------------------------------------------
def gguf_plan(config: ModelConfig, fuse_gate_up: bool = False) -> list[GGUFTensor]:
    """Every GGUF tensor of the text model, in file order."""
    arch_of(config)
    _check_dims(config)
    h, v = config.hidden_size, config.vocab_size
    # Tied: the embedding is the output head too, so it takes the head's type (as llama-quantize does).
    embed_role = OUTPUT if config.tie_word_embeddings else EMBED
    plan = [GGUFTensor("token_embd.weight", (v, h), embed_role, "embed_tokens.weight", std=1.0)]
    for i in range(config.num_hidden_layers):
        plan += _layer(config, i, fuse_gate_up)
    plan.append(GGUFTensor("output_norm.weight", (h,), NORM, "norm.weight", _plus_one))
    if not config.tie_word_embeddings:
        plan.append(GGUFTensor("output.weight", (v, h), OUTPUT, "lm_head.weight", std=h**-0.5))
    return plan


def _linear(name: str, out: int, inp: int, source: str, convert: Convert | None = None, role: str = MATRIX):
    return GGUFTensor(name, (out, inp), role, source, convert, std=inp**-0.5)


def _layer(config: ModelConfig, i: int, fuse_gate_up: bool) -> list[GGUFTensor]:
    h, b, p = config.hidden_size, f"blk.{i}.", f"layers.{i}."
    out = [GGUFTensor(b + "attn_norm.weight", (h,), NORM, p + "input_layernorm.weight", _plus_one)]
    out += _attention(config, b, p) if config.is_full_attention(i) else _deltanet(config, b, p)
    post = p + "post_attention_layernorm.weight"
    out.append(GGUFTensor(b + "post_attention_norm.weight", (h,), NORM, post, _plus_one))
    out += _moe(config, b, p, fuse_gate_up) if config.sparse_layers[i] else _dense_mlp(config, b, p)
    return out


def _attention(config: ModelConfig, b: str, p: str) -> list[GGUFTensor]:
    h, d = config.hidden_size, config.head_dim
    q_out = config.num_attention_heads * d * (2 if config.attn_output_gate else 1)  # per head [query | gate]
    kv = config.num_key_value_heads * d
    a = p + "self_attn."
    return [
        _linear(b + "attn_q.weight", q_out, h, a + "q_proj.weight"),
        _linear(b + "attn_k.weight", kv, h, a + "k_proj.weight"),
        _linear(b + "attn_v.weight", kv, h, a + "v_proj.weight"),
        _linear(b + "attn_output.weight", h, config.num_attention_heads * d, a + "o_proj.weight"),
        GGUFTensor(b + "attn_q_norm.weight", (d,), NORM, a + "q_norm.weight", _plus_one),
        GGUFTensor(b + "attn_k_norm.weight", (d,), NORM, a + "k_norm.weight", _plus_one),
    ]


def _deltanet(config: ModelConfig, b: str, p: str) -> list[GGUFTensor]:
    h, hv, dv, vh = config.hidden_size, config.linear_num_value_heads, config.linear_value_head_dim, _VHeads(config)
    conv_shape = (config.conv_dim, config.linear_conv_kernel_dim)  # [C, K]
    la = p + "linear_attn."
    return [
        _linear(b + "attn_qkv.weight", config.conv_dim, h, la + "in_proj_qkv.weight", vh.qkv_rows),
        _linear(b + "attn_gate.weight", config.value_dim, h, la + "in_proj_z.weight", vh.rows(dv)),
        _linear(b + "ssm_beta.weight", hv, h, la + "in_proj_b.weight", vh.rows(1)),
        _linear(b + "ssm_alpha.weight", hv, h, la + "in_proj_a.weight", vh.rows(1)),
        GGUFTensor(b + "ssm_conv1d.weight", conv_shape, CONV, la + "conv1d.weight", vh.conv),
        GGUFTensor(b + "ssm_a", (hv,), VECTOR, la + "A_log", vh.a_log),
        GGUFTensor(b + "ssm_dt.bias", (hv,), VECTOR, la + "dt_bias", vh.rows(1)),
        GGUFTensor(b + "ssm_norm.weight", (dv,), NORM, la + "norm.weight"),
        _linear(b + "ssm_out.weight", h, config.value_dim, la + "out_proj.weight", vh.out_cols),
    ]


def _moe(config: ModelConfig, b: str, p: str, fuse_gate_up: bool) -> list[GGUFTensor]:
    h, e, inter = config.hidden_size, config.num_experts, config.moe_intermediate_size
    m, x = p + "mlp.", p + "mlp.experts."
    out = [GGUFTensor(b + "ffn_gate_inp.weight", (e, h), ROUTER, m + "gate.weight", std=h**-0.5)]
    if fuse_gate_up:  # llama.cpp splits [gate | up] along the 2I rows itself, gate first as in the checkpoint
        fused = (e, 2 * inter, h)
        out.append(GGUFTensor(b + "ffn_gate_up_exps.weight", fused, MATRIX, x + "gate_up_proj", std=h**-0.5))
    else:
        gate, up = (lambda t: t[:, :inter]), (lambda t: t[:, inter:])  # [E, 2I, H] -> [E, I, H]
        out.append(GGUFTensor(b + "ffn_gate_exps.weight", (e, inter, h), MATRIX, x + "gate_up_proj", gate, h**-0.5))
        out.append(GGUFTensor(b + "ffn_up_exps.weight", (e, inter, h), MATRIX, x + "gate_up_proj", up, h**-0.5))
    out.append(GGUFTensor(b + "ffn_down_exps.weight", (e, h, inter), MATRIX, x + "down_proj", std=inter**-0.5))
    shared = config.shared_expert_intermediate_size
    if shared:
        s = m + "shared_expert."
        out += [
            _linear(b + "ffn_gate_shexp.weight", shared, h, s + "gate_proj.weight"),
            _linear(b + "ffn_up_shexp.weight", shared, h, s + "up_proj.weight"),
            _linear(b + "ffn_down_shexp.weight", h, shared, s + "down_proj.weight"),
            GGUFTensor(b + "ffn_gate_inp_shexp.weight", (h,), VECTOR, m + "shared_expert_gate.weight",
                       lambda t: t.reshape(-1), h**-0.5),  # [1, H] -> [H]
        ]
    return out


def _dense_mlp(config: ModelConfig, b: str, p: str) -> list[GGUFTensor]:
    h, inter, m = config.hidden_size, config.intermediate_size, p + "mlp."
    return [
        _linear(b + "ffn_gate.weight", inter, h, m + "gate_proj.weight"),
        _linear(b + "ffn_up.weight", inter, h, m + "up_proj.weight"),
        _linear(b + "ffn_down.weight", h, inter, m + "down_proj.weight"),
    ]
