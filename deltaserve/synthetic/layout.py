"""Which tensors a checkpoint holds: published names, shapes and how each is initialised.

Layouts (spec sections 2 and 6):
- qwen3_5 / qwen3_5_moe: `model.language_model.*`, `lm_head.weight` (absent when tied), `mtp.*` (top level),
  `model.visual.*`; GDN projections as four tensors in_proj_qkv ([Q;K;V] flat), in_proj_z, in_proj_b, in_proj_a.
- qwen3_next: flat `model.*`, `lm_head.weight`, `mtp.*`, no vision; GDN projections fused per key-head group:
  in_proj_qkvz rows per group g = [q_g (dk), k_g (dk), v_g (r*dv), z_g (r*dv)], in_proj_ba rows = [b_g (r), a_g (r)].
- routed experts either fused (`experts.gate_up_proj` [E, 2I, H] gate rows first, `experts.down_proj` [E, H, I],
  no ".weight") or per expert (`experts.{e}.{gate,up,down}_proj.weight`). Expert e of a bank has its own
  generator in both layouts, so both layouts of one seed describe the same model.

A TensorSpec only describes a tensor; its values are made on demand (`spec.make(rng)`), so a writer can hold one
shard in memory at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..model.config import ModelConfig
from .init import Rng
from .presets import VisionDims

EXPERT_LAYOUTS = ("fused", "per_expert")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    make: Callable[[Rng], torch.Tensor]  # fp32 values of `shape`
    keep_fp32: bool = False  # stored F32 whatever the checkpoint dtype (A_log, as published)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def nbytes(self, dtype: torch.dtype) -> int:
        item = 4 if self.keep_fp32 else torch.empty((), dtype=dtype).element_size()
        return self.numel() * item


def _spec(name: str, shape: tuple[int, ...], init: str, keep_fp32: bool = False) -> TensorSpec:
    """A tensor whose values come from Rng.<init>(name, shape-or-size)."""
    arg = shape[0] if init in ("zero_centred_norm", "unit_norm", "bias", "a_log", "dt_bias") else shape
    return TensorSpec(name, shape, lambda rng: getattr(rng, init)(name, arg), keep_fp32)


def _lin(name: str, out_features: int, in_features: int) -> TensorSpec:
    return _spec(name, (out_features, in_features), "linear")


# ---- language model --------------------------------------------------------------------------------------------


def checkpoint_tensors(
    cfg: ModelConfig, vision: VisionDims | None, expert_layout: str, mtp_layers: int
) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in module order (embedding, layers, norm, head, MTP, vision)."""
    if expert_layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert_layout must be one of {EXPERT_LAYOUTS}, found {expert_layout!r}")
    flat = cfg.model_type == "qwen3_next"
    lm = "model." if flat else "model.language_model."
    H = cfg.hidden_size
    specs = [_spec(f"{lm}embed_tokens.weight", (cfg.vocab_size, H), "embedding")]
    for i in range(cfg.num_hidden_layers):
        p = f"{lm}layers.{i}"
        specs.append(_spec(f"{p}.input_layernorm.weight", (H,), "zero_centred_norm"))
        if cfg.is_full_attention(i):
            specs += _attention(f"{p}.self_attn", cfg)
        elif flat:
            specs += _gated_deltanet_fused(f"{p}.linear_attn", cfg)
        else:
            specs += _gated_deltanet(f"{p}.linear_attn", cfg)
        specs.append(_spec(f"{p}.post_attention_layernorm.weight", (H,), "zero_centred_norm"))
        specs += _ffn(f"{p}.mlp", cfg, cfg.sparse_layers[i], expert_layout)
    specs.append(_spec(f"{lm}norm.weight", (H,), "zero_centred_norm"))
    if not cfg.tie_word_embeddings:
        specs.append(_lin("lm_head.weight", cfg.vocab_size, H))
    specs += _mtp(cfg, mtp_layers, expert_layout)
    if vision is not None and not flat:
        specs += _vision("model.visual", vision)
    _check_unique(specs)
    return specs


def _attention(p: str, cfg: ModelConfig) -> list[TensorSpec]:
    H, hd = cfg.hidden_size, cfg.head_dim
    q_rows = cfg.num_attention_heads * hd * (2 if cfg.attn_output_gate else 1)  # per head [query | gate]
    return [
        _lin(f"{p}.q_proj.weight", q_rows, H),
        _lin(f"{p}.k_proj.weight", cfg.num_key_value_heads * hd, H),
        _lin(f"{p}.v_proj.weight", cfg.num_key_value_heads * hd, H),
        _lin(f"{p}.o_proj.weight", H, cfg.num_attention_heads * hd),
        _spec(f"{p}.q_norm.weight", (hd,), "zero_centred_norm"),
        _spec(f"{p}.k_norm.weight", (hd,), "zero_centred_norm"),
    ]


def _gdn_state_tensors(p: str, cfg: ModelConfig) -> list[TensorSpec]:
    """The GDN tensors both layouts share: conv, decay parameters, gated norm, output projection."""
    Hv = cfg.linear_num_value_heads
    return [
        _spec(f"{p}.conv1d.weight", (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim), "conv"),
        _spec(f"{p}.dt_bias", (Hv,), "dt_bias"),
        _spec(f"{p}.A_log", (Hv,), "a_log", keep_fp32=True),
        _spec(f"{p}.norm.weight", (cfg.linear_value_head_dim,), "unit_norm"),
        _lin(f"{p}.out_proj.weight", cfg.hidden_size, cfg.value_dim),
    ]


def _gated_deltanet(p: str, cfg: ModelConfig) -> list[TensorSpec]:
    H, Hv = cfg.hidden_size, cfg.linear_num_value_heads
    return [
        _lin(f"{p}.in_proj_qkv.weight", cfg.conv_dim, H),  # rows [Q (Hk*dk) ; K (Hk*dk) ; V (Hv*dv)]
        _lin(f"{p}.in_proj_z.weight", cfg.value_dim, H),
        _lin(f"{p}.in_proj_b.weight", Hv, H),
        _lin(f"{p}.in_proj_a.weight", Hv, H),
    ] + _gdn_state_tensors(p, cfg)


def _gated_deltanet_fused(p: str, cfg: ModelConfig) -> list[TensorSpec]:
    """Qwen3-Next: in_proj_qkvz / in_proj_ba, interleaved per key-head group from logical q,k,v,z,b,a."""
    H, Hk, Hv = cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, Hv // Hk
    kd, vd = cfg.key_dim, cfg.value_dim

    def qkvz(rng: Rng) -> torch.Tensor:
        qkv = rng.linear(f"{p}.in_proj_qkv.weight", (cfg.conv_dim, H))
        z = rng.linear(f"{p}.in_proj_z.weight", (vd, H))
        q, k, v = qkv[:kd].view(Hk, dk, H), qkv[kd : 2 * kd].view(Hk, dk, H), qkv[2 * kd :].view(Hk, r * dv, H)
        return torch.cat([q, k, v, z.view(Hk, r * dv, H)], dim=1).reshape(2 * kd + 2 * vd, H)

    def ba(rng: Rng) -> torch.Tensor:
        b = rng.linear(f"{p}.in_proj_b.weight", (Hv, H)).view(Hk, r, H)
        a = rng.linear(f"{p}.in_proj_a.weight", (Hv, H)).view(Hk, r, H)
        return torch.cat([b, a], dim=1).reshape(2 * Hv, H)

    return [
        TensorSpec(f"{p}.in_proj_qkvz.weight", (2 * kd + 2 * vd, H), qkvz),
        TensorSpec(f"{p}.in_proj_ba.weight", (2 * Hv, H), ba),
    ] + _gdn_state_tensors(p, cfg)


def _ffn(p: str, cfg: ModelConfig, sparse: bool, expert_layout: str) -> list[TensorSpec]:
    H = cfg.hidden_size
    if not sparse:
        inter = cfg.intermediate_size
        return [_lin(f"{p}.gate_proj.weight", inter, H), _lin(f"{p}.up_proj.weight", inter, H),
                _lin(f"{p}.down_proj.weight", H, inter)]  # fmt: skip
    E, inter = cfg.num_experts, cfg.moe_intermediate_size
    specs = [_spec(f"{p}.gate.weight", (E, H), "router")]
    specs += _experts(f"{p}.experts", E, H, inter, expert_layout)
    shared = cfg.shared_expert_intermediate_size
    if shared:
        specs += [
            _lin(f"{p}.shared_expert.gate_proj.weight", shared, H),
            _lin(f"{p}.shared_expert.up_proj.weight", shared, H),
            _lin(f"{p}.shared_expert.down_proj.weight", H, shared),
            _lin(f"{p}.shared_expert_gate.weight", 1, H),
        ]
    return specs


def _experts(p: str, E: int, H: int, inter: int, layout: str) -> list[TensorSpec]:
    """Both layouts draw expert e from the generator of (bank name, e), so per-expert tensors equal the fused
    banks' slices and never need a whole bank in memory."""
    gate_up, down = f"{p}.gate_up_proj", f"{p}.down_proj"
    if layout == "fused":
        return [
            TensorSpec(gate_up, (E, 2 * inter, H), lambda rng: rng.expert_bank(gate_up, (E, 2 * inter, H))),
            TensorSpec(down, (E, H, inter), lambda rng: rng.expert_bank(down, (E, H, inter))),
        ]
    specs = []
    for e in range(E):
        gu = lambda rng, e=e: rng.expert(gate_up, e, (2 * inter, H))  # noqa: E731  [2I, H], gate rows first
        specs += [
            TensorSpec(f"{p}.{e}.gate_proj.weight", (inter, H), lambda rng, gu=gu: gu(rng)[:inter].clone()),
            TensorSpec(f"{p}.{e}.up_proj.weight", (inter, H), lambda rng, gu=gu: gu(rng)[inter:].clone()),
            TensorSpec(f"{p}.{e}.down_proj.weight", (H, inter), lambda rng, e=e: rng.expert(down, e, (H, inter))),
        ]
    return specs


def _mtp(cfg: ModelConfig, n_layers: int, expert_layout: str) -> list[TensorSpec]:
    """MTP head (spec 2.3): fc over [embedding ; hidden], its norms, and full-attention decoder layers."""
    if n_layers <= 0:
        return []
    H = cfg.hidden_size
    specs = [_lin("mtp.fc.weight", H, 2 * H)]
    for i in range(n_layers):
        p = f"mtp.layers.{i}"
        specs.append(_spec(f"{p}.input_layernorm.weight", (H,), "zero_centred_norm"))
        specs += _attention(f"{p}.self_attn", cfg)
        specs.append(_spec(f"{p}.post_attention_layernorm.weight", (H,), "zero_centred_norm"))
        specs += _ffn(f"{p}.mlp", cfg, cfg.is_moe, expert_layout)
    for name in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        specs.append(_spec(f"mtp.{name}.weight", (H,), "zero_centred_norm"))
    return specs


# ---- vision tower (spec 2.4) -----------------------------------------------------------------------------------


def _vision(p: str, v: VisionDims) -> list[TensorSpec]:
    D, inter = v.hidden_size, v.intermediate_size
    patch = (D, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)  # Conv3d, kernel = stride
    patch_in = v.in_channels * v.temporal_patch_size * v.patch_size**2  # fan-in of one patch (1536 published)
    name = f"{p}.patch_embed.proj.weight"
    specs = [
        TensorSpec(name, patch, lambda rng: rng.linear(name, (D, patch_in)).view(patch)),
        _spec(f"{p}.patch_embed.proj.bias", (D,), "bias"),
        _spec(f"{p}.pos_embed.weight", (v.num_position_embeddings, D), "embedding"),
    ]
    for i in range(v.depth):
        b = f"{p}.blocks.{i}"
        specs += _layer_norm(f"{b}.norm1", D) + _layer_norm(f"{b}.norm2", D)
        specs += _affine(f"{b}.attn.qkv", 3 * D, D) + _affine(f"{b}.attn.proj", D, D)
        specs += _affine(f"{b}.mlp.linear_fc1", inter, D) + _affine(f"{b}.mlp.linear_fc2", D, inter)
    merged = D * v.spatial_merge_size**2  # one 2x2 window of patches, concatenated
    specs += _layer_norm(f"{p}.merger.norm", D)
    specs += _affine(f"{p}.merger.linear_fc1", merged, merged)
    specs += _affine(f"{p}.merger.linear_fc2", v.out_hidden_size, merged)
    return specs


def _layer_norm(p: str, n: int) -> list[TensorSpec]:
    return [_spec(f"{p}.weight", (n,), "unit_norm"), _spec(f"{p}.bias", (n,), "bias")]


def _affine(p: str, out_features: int, in_features: int) -> list[TensorSpec]:
    return [_lin(f"{p}.weight", out_features, in_features), _spec(f"{p}.bias", (out_features,), "bias")]


def _check_unique(specs: list[TensorSpec]) -> None:
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise AssertionError(f"layout bug: tensor {s.name} listed twice")
        seen.add(s.name)
