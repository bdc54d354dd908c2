"""Name mapping for the Hugging Face (unquantised) layouts: file tensor name -> our parameter name(s).

Our parameter names are the published Qwen3.5 names without the `model.language_model.` prefix
(`layers.N.linear_attn.in_proj_qkv.weight`, `layers.N.mlp.experts.gate_up_proj`, `embed_tokens.weight`, ...).

Layouts handled here:
- qwen3_5 / qwen3_5_moe: `model.language_model.<ours>`; `lm_head.weight`; experts fused (`experts.gate_up_proj`
  [E, 2I, H], `experts.down_proj` [E, H, I]) or per expert (`experts.{e}.{gate,up,down}_proj.weight`, stacked into
  the fused parameters slice by slice: gate -> rows [0, I) of expert e, up -> rows [I, 2I), down -> expert e).
- qwen3_next: flat `model.<ours>`, per-expert experts, and the group-interleaved fused GDN projections
  `in_proj_qkvz` [Hk*(2dk + 2r*dv), H] and `in_proj_ba` [Hk*2r, H] (r = Hv/Hk), split into our flat
  `in_proj_qkv` ([Q; K; V]), `in_proj_z`, `in_proj_b`, `in_proj_a`. Per key-head group g the rows are
  [q_g (dk), k_g (dk), v_g (r*dv), z_g (r*dv)] and [b_g (r), a_g (r)].
- the MTP head `mtp.*` (top level, spec 2.3): ours under the same names (`mtp.fc.weight`, `mtp.layers.0.self_attn.
  q_proj.weight`, ...; its experts fused or per expert like the body's) when the model is built with it (mtp=True),
  else set aside;
- set aside (known, unused by the text model): `model.visual.*` (vision tower), and `lm_head.weight` when
  embeddings are tied (transformers ties it to the embedding and ignores the file copy).
Anything else is unknown (None) and the loader refuses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from ..model.config import ModelConfig

LANGUAGE_PREFIXES = ("model.language_model.", "model.")  # nested qwen3_5*, flat qwen3_next
MTP_PREFIX = "mtp."  # the MTP head: top level in every published layout, our names unchanged
SET_ASIDE_PREFIXES = (("mtp.", "mtp"), ("model.visual.", "visual"))

_EXPERT = re.compile(r"^((?:mtp\.)?layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_QKVZ = re.compile(r"^(layers\.\d+\.linear_attn)\.in_proj_(qkvz|ba)\.weight$")

Transform = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Target:
    """One destination of a file tensor: our parameter, where in it, and how to reshape the file tensor first."""

    param: str
    index: tuple = ()
    transform: Transform | None = None
    note: str = ""


@dataclass(frozen=True)
class Aside:
    group: str


def strip_language_prefix(name: str, mtp: bool = False) -> str | None:
    """Our name for a language-model tensor (with mtp: an MTP head tensor too), or None if the name has no
    language-model prefix."""
    if name == "lm_head.weight" or (mtp and name.startswith(MTP_PREFIX)):
        return name
    for prefix in LANGUAGE_PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            if rest.startswith(("layers.", "embed_tokens.", "norm.")):
                return rest
    return None


def map_hf_name(name: str, config: ModelConfig, mtp: bool = False) -> list[Target] | Aside | None:
    """Where file tensor `name` goes (list of Targets), that it is set aside (Aside), or None if unknown.
    mtp: the model holds the MTP head, so `mtp.*` tensors are mapped rather than set aside."""
    for prefix, group in SET_ASIDE_PREFIXES:
        if name.startswith(prefix) and not (mtp and prefix == MTP_PREFIX):
            return Aside(group)
    ours = strip_language_prefix(name, mtp)
    if ours is None:
        return None
    if ours == "lm_head.weight" and config.tie_word_embeddings:
        return Aside("tied_lm_head")
    m = _EXPERT.match(ours)
    if m:
        return [_expert_target(m.group(1), int(m.group(2)), m.group(3), config)]
    m = _QKVZ.match(ours)
    if m:
        return _split_fused_gdn(m.group(1), m.group(2), config)
    return [Target(ours)]


def hf_source_name(param: str, config: ModelConfig) -> str:
    """The file tensor a qwen3_5* / qwen3_next HF checkpoint would hold for our parameter (error messages)."""
    if param == "lm_head.weight":
        return param
    prefix = "model." if config.model_type == "qwen3_next" else "model.language_model."
    if param.startswith(MTP_PREFIX):
        prefix = ""  # the MTP head is top level in every layout
    if config.model_type == "qwen3_next":
        param = re.sub(r"in_proj_(qkv|z)\.weight$", "in_proj_qkvz.weight", param)
        param = re.sub(r"in_proj_(a|b)\.weight$", "in_proj_ba.weight", param)
    if param.endswith(("experts.gate_up_proj", "experts.down_proj")):
        per = "{gate,up}_proj" if param.endswith("gate_up_proj") else "down_proj"
        base = param.rsplit(".", 1)[0]
        return f"{prefix}{param} (or per expert {prefix}{base}.{{e}}.{per}.weight)"
    return prefix + param


# ---- per-expert stacking ---------------------------------------------------------------------------------------


def _expert_target(experts: str, e: int, proj: str, config: ModelConfig) -> Target:
    inter = config.moe_intermediate_size
    if proj == "down_proj":  # [H, I] -> down_proj[e]
        return Target(f"{experts}.down_proj", (e,), note=f"expert {e} of the stacked down_proj")
    rows = slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)  # gate rows first, then up
    return Target(f"{experts}.gate_up_proj", (e, rows), note=f"expert {e} {proj} rows of the stacked gate_up_proj")


# ---- qwen3_next fused GDN projections ----------------------------------------------------------------------------


def _split_fused_gdn(prefix: str, kind: str, config: ModelConfig) -> list[Target]:
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv, r = config.linear_key_head_dim, config.linear_value_head_dim, hv // hk
    if kind == "qkvz":
        sizes = [dk, dk, r * dv, r * dv]  # per group: q_g, k_g, v_g, z_g
        note = f"group-interleaved in_proj_qkvz ({hk} groups of q {dk}, k {dk}, v {r * dv}, z {r * dv} rows)"
        return [
            Target(f"{prefix}.in_proj_qkv.weight", transform=_group_rows(hk, sizes, (0, 1, 2)), note=note),
            Target(f"{prefix}.in_proj_z.weight", transform=_group_rows(hk, sizes, (3,)), note=note),
        ]
    sizes = [r, r]  # per group: b_g, a_g
    note = f"group-interleaved in_proj_ba ({hk} groups of b {r}, a {r} rows)"
    return [
        Target(f"{prefix}.in_proj_b.weight", transform=_group_rows(hk, sizes, (0,)), note=note),
        Target(f"{prefix}.in_proj_a.weight", transform=_group_rows(hk, sizes, (1,)), note=note),
    ]


def _group_rows(groups: int, sizes: list[int], pick: tuple[int, ...]) -> Transform:
    """Rows of a group-interleaved tensor [groups * sum(sizes), ...] regrouped part-major.

    The result is cat over p in pick of (part p of group 0, part p of group 1, ...): for pick (0, 1, 2) on qkvz this
    is the flat [Q (all heads); K; V] layout. Only views and one cat, so it runs on meta tensors too.
    """
    per_group = sum(sizes)

    def transform(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] != groups * per_group:
            raise ValueError(f"expected {groups * per_group} rows ({groups} groups x {per_group}), found {t.shape[0]}")
        parts = t.reshape(groups, per_group, *t.shape[1:]).split(sizes, dim=1)
        return torch.cat([parts[p].reshape(groups * sizes[p], *t.shape[1:]) for p in pick], dim=0)

    return transform
