"""The one place that reads config.json keys.

`ModelConfig` is the text-model description for the three families we serve:

- `qwen3_5` / `qwen3_5_moe`: nested config, language fields under `text_config`, vision under `vision_config`;
- `qwen3_next`: flat config (no text_config, no vision).

Everything else in deltaserve reads a `ModelConfig`, never the raw dict (except `raw`, kept for tools that must
write a config back out, such as the quantiser).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


class ConfigError(ValueError):
    """A config.json that deltaserve cannot serve; the message names the file and the field."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # qwen3_5 | qwen3_5_moe | qwen3_next
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # per layer: linear_attention | full_attention
    rms_norm_eps: float
    tie_word_embeddings: bool
    hidden_act: str
    max_position_embeddings: int
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_output_gate: bool
    rope_theta: float
    partial_rotary_factor: float
    mrope_section: tuple[int, ...] | None  # e.g. (11, 11, 10); None for plain 1-D RoPE
    mrope_interleaved: bool
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # feed-forward
    intermediate_size: int | None  # dense SwiGLU width (dense models, or qwen3_next mlp_only layers)
    num_experts: int  # 0 for dense models
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]  # per layer: MoE block (True) or dense MLP (False)
    # heads and tokens
    mtp_num_hidden_layers: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    dtype: str  # checkpoint dtype name, e.g. "bfloat16"
    # multimodal (qwen3_5*, kept raw for the vision issue)
    vision_config: dict | None = None
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    # quantisation entries exactly as written (MLX `quantization`, HF `quantization_config`)
    quantization: dict | None = None
    quantization_config: dict | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- derived sizes -------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def key_dim(self) -> int:  # Hk * dk
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:  # Hv * dv
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:  # channels of the causal conv: [q | k | v]
        return 2 * self.key_dim + self.value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION]

    def is_full_attention(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL_ATTENTION

    # ---- parsing -------------------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        cfg_file = path / "config.json" if path.is_dir() else path
        if not cfg_file.exists():
            raise ConfigError(f"{cfg_file}: no config.json found (is {path} a checkpoint directory?)")
        try:
            data = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{cfg_file}: not valid JSON ({e})") from None
        return cls.from_dict(data, source=str(cfg_file))

    @classmethod
    def from_dict(cls, data: dict, source: str = "config.json") -> "ModelConfig":
        return _parse(data, source)

    def vision(self) -> "VisionConfig | None":
        """The vision tower's shape (spec 2.4, 3.10) from `vision_config`, or None for a text-only config."""
        if self.vision_config is None:
            return None
        return parse_vision_config(self.vision_config)

    def to_text_dict(self) -> dict:
        """The language-model fields in the published `text_config` spelling (used by writers)."""
        return dict(self.raw.get("text_config", self.raw))


@dataclass(frozen=True)
class VisionConfig:
    """The Qwen3-VL-style vision tower without deepstack (Qwen3.5 / 3.6): `vision_config` of config.json."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int  # = the text hidden size: one merged token per 2x2 window of patches
    num_position_embeddings: int  # a side x side learned grid (48 x 48 published)
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    model_type: str = "qwen3_5_vision"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values of one flattened patch row: C * T * P * P (1536 published)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def grid_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @property
    def factor(self) -> int:
        """Image sides are resized to multiples of this (patch * merge = 32 published)."""
        return self.patch_size * self.spatial_merge_size


def parse_vision_config(data: dict, source: str = "config.json") -> VisionConfig:
    f = _Fields(data, source, "vision_config")
    deepstack = f.get("deepstack_visual_indexes", [], list)
    if deepstack:
        raise ConfigError(f"{source}: 'vision_config.deepstack_visual_indexes' = {deepstack}: deepstack features are "
                          "not part of Qwen3.5/3.6 (expected [])")
    act = f.get("hidden_act", "gelu_pytorch_tanh", str)
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"{source}: 'vision_config.hidden_act' = {act!r} is not supported (expected "
                          "'gelu_pytorch_tanh')")
    rope = f.get("rope_parameters", None, dict) or {}
    cfg = VisionConfig(
        depth=_positive(f, "depth", f.need("depth")),
        hidden_size=_positive(f, "hidden_size", f.need("hidden_size")),
        num_heads=_positive(f, "num_heads", f.need("num_heads")),
        intermediate_size=_positive(f, "intermediate_size", f.need("intermediate_size")),
        out_hidden_size=_positive(f, "out_hidden_size", f.need("out_hidden_size")),
        num_position_embeddings=_positive(f, "num_position_embeddings", f.get("num_position_embeddings", 2304)),
        patch_size=_positive(f, "patch_size", f.get("patch_size", 16)),
        temporal_patch_size=_positive(f, "temporal_patch_size", f.get("temporal_patch_size", 2)),
        spatial_merge_size=_positive(f, "spatial_merge_size", f.get("spatial_merge_size", 2)),
        in_channels=_positive(f, "in_channels", f.get("in_channels", 3)),
        hidden_act=act,
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        model_type=f.get("model_type", "qwen3_5_vision", str),
    )
    if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 4:
        raise ConfigError(f"{source}: vision_config hidden_size {cfg.hidden_size} / num_heads {cfg.num_heads} must "
                          "give a head_dim divisible by 4 (2-D rotary over (row, col) halves)")
    if cfg.grid_side**2 != cfg.num_position_embeddings:
        raise ConfigError(f"{source}: 'vision_config.num_position_embeddings' = {cfg.num_position_embeddings} is "
                          "not a square (a side x side learned grid)")
    return cfg


# ---- the parser ------------------------------------------------------------------------------------------------


class _Fields:
    """Reads fields of one (sub-)dict, raising ConfigError that names file, section and field."""

    def __init__(self, data: dict, source: str, section: str):
        self.data, self.source, self.section = data, source, section

    def where(self, key: str) -> str:
        return f"{self.section}.{key}" if self.section else key

    def need(self, key: str, kind: type | tuple = (int,)) -> Any:
        if key not in self.data or self.data[key] is None:
            raise ConfigError(f"{self.source}: required field '{self.where(key)}' is missing")
        return self._check(key, self.data[key], kind)

    def get(self, key: str, default: Any, kind: type | tuple = (int,)) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        return self._check(key, value, kind)

    def _check(self, key: str, value: Any, kind: type | tuple) -> Any:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        else:
            ok = isinstance(value, kinds)
        if not ok:
            names = "/".join(k.__name__ for k in kinds)
            raise ConfigError(
                f"{self.source}: field '{self.where(key)}' should be {names}, found {type(value).__name__} {value!r}"
            )
        return value


def _positive(f: _Fields, key: str, value: int) -> int:
    if value <= 0:
        raise ConfigError(f"{f.source}: field '{f.where(key)}' must be positive, found {value}")
    return value


def _parse(data: dict, source: str) -> ModelConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object at the top level")
    model_type = data.get("model_type")
    if model_type is None:
        raise ConfigError(f"{source}: required field 'model_type' is missing")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{source}: unknown model_type {model_type!r}; deltaserve supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )

    if model_type == "qwen3_next":
        text = _Fields(data, source, "")
    else:
        if "text_config" not in data or not isinstance(data["text_config"], dict):
            raise ConfigError(f"{source}: required field 'text_config' is missing (model_type {model_type!r})")
        text = _Fields(data["text_config"], source, "text_config")

    n_layers = _positive(text, "num_hidden_layers", text.need("num_hidden_layers"))
    layer_types = _layer_types(text, n_layers)
    rope_theta, partial, mrope, mrope_interleaved = _rope(text)

    head_dim = text.get("head_dim", None)
    hidden = _positive(text, "hidden_size", text.need("hidden_size"))
    n_heads = _positive(text, "num_attention_heads", text.need("num_attention_heads"))
    if head_dim is None:
        head_dim = hidden // n_heads

    is_moe = model_type in ("qwen3_5_moe", "qwen3_next")
    if is_moe:
        n_experts = _positive(text, "num_experts", text.need("num_experts"))
        top_k = _positive(text, "num_experts_per_tok", text.need("num_experts_per_tok"))
        if top_k > n_experts:
            raise ConfigError(
                f"{source}: '{text.where('num_experts_per_tok')}' = {top_k} exceeds num_experts = {n_experts}"
            )
        moe_inter = _positive(text, "moe_intermediate_size", text.need("moe_intermediate_size"))
        shared_inter = text.get("shared_expert_intermediate_size", 0)
    else:
        n_experts, top_k, moe_inter, shared_inter = 0, 0, 0, 0

    sparse = _sparse_layers(text, model_type, n_layers)
    inter = text.get("intermediate_size", None)
    if not all(sparse) and inter is None:
        raise ConfigError(f"{source}: required field '{text.where('intermediate_size')}' is missing (dense MLP layers)")

    eos = text.get("eos_token_id", None, (int, list))
    if eos is None:
        eos = data.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    tie = bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False, bool)))

    vision = data.get("vision_config") if model_type != "qwen3_next" else None
    cfg = ModelConfig(
        model_type=model_type,
        vocab_size=_positive(text, "vocab_size", text.need("vocab_size")),
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        layer_types=layer_types,
        rms_norm_eps=text.get("rms_norm_eps", 1e-6, float),
        tie_word_embeddings=tie,
        hidden_act=text.get("hidden_act", "silu", str),
        max_position_embeddings=text.get("max_position_embeddings", 262144),
        num_attention_heads=n_heads,
        num_key_value_heads=_positive(text, "num_key_value_heads", text.need("num_key_value_heads")),
        head_dim=head_dim,
        attn_output_gate=text.get("attn_output_gate", True, bool),
        rope_theta=rope_theta,
        partial_rotary_factor=partial,
        mrope_section=mrope,
        mrope_interleaved=mrope_interleaved,
        linear_num_key_heads=_positive(text, "linear_num_key_heads", text.need("linear_num_key_heads")),
        linear_num_value_heads=_positive(text, "linear_num_value_heads", text.need("linear_num_value_heads")),
        linear_key_head_dim=_positive(text, "linear_key_head_dim", text.need("linear_key_head_dim")),
        linear_value_head_dim=_positive(text, "linear_value_head_dim", text.need("linear_value_head_dim")),
        linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
        intermediate_size=inter,
        num_experts=n_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        # Qwen3.5/3.6 always renormalise the top-k weights; Qwen3-Next has the switch.
        norm_topk_prob=text.get("norm_topk_prob", True, bool) if model_type == "qwen3_next" else True,
        sparse_layers=sparse,
        mtp_num_hidden_layers=text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)),
        eos_token_ids=eos_ids,
        bos_token_id=text.get("bos_token_id", data.get("bos_token_id")),
        pad_token_id=text.get("pad_token_id", data.get("pad_token_id")),
        dtype=_dtype_name(text, data),
        vision_config=vision if isinstance(vision, dict) else None,
        image_token_id=data.get("image_token_id"),
        video_token_id=data.get("video_token_id"),
        vision_start_token_id=data.get("vision_start_token_id"),
        vision_end_token_id=data.get("vision_end_token_id"),
        quantization=data.get("quantization"),
        quantization_config=data.get("quantization_config"),
        raw=data,
    )
    _validate(cfg, text)
    return cfg


def _dtype_name(text: _Fields, data: dict) -> str:
    """Checkpoint dtype: text_config.dtype / torch_dtype, else the top-level dtype / torch_dtype (nested configs
    may carry it only at the top level), else bfloat16."""
    for value in (text.data.get("dtype"), text.data.get("torch_dtype"), data.get("dtype"), data.get("torch_dtype")):
        if value is not None:
            return str(value)
    return "bfloat16"


def _layer_types(text: _Fields, n_layers: int) -> tuple[str, ...]:
    types = text.get("layer_types", None, list)
    if types is None:
        interval = _positive(text, "full_attention_interval", text.get("full_attention_interval", 4))
        return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n_layers))
    if len(types) != n_layers:
        raise ConfigError(
            f"{text.source}: '{text.where('layer_types')}' has {len(types)} entries, expected num_hidden_layers = {n_layers}"
        )
    for i, t in enumerate(types):
        if t not in (LINEAR_ATTENTION, FULL_ATTENTION):
            raise ConfigError(
                f"{text.source}: '{text.where('layer_types')}[{i}]' is {t!r}, expected "
                f"'{LINEAR_ATTENTION}' or '{FULL_ATTENTION}'"
            )
    return tuple(types)


def _rope(text: _Fields) -> tuple[float, float, tuple[int, ...] | None, bool]:
    params = text.get("rope_parameters", None, dict) or text.get("rope_scaling", None, dict) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ConfigError(
            f"{text.source}: '{text.where('rope_parameters.rope_type')}' = {rope_type!r} is not supported "
            "(the Qwen3.5/3.6 family ships 'default')"
        )
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0, float))
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25, float))
    section = params.get("mrope_section")
    interleaved = bool(params.get("mrope_interleaved", False))
    if not (0.0 < float(partial) <= 1.0):
        raise ConfigError(f"{text.source}: partial_rotary_factor must be in (0, 1], found {partial}")
    return float(theta), float(partial), (tuple(int(s) for s in section) if section else None), interleaved


def _sparse_layers(text: _Fields, model_type: str, n_layers: int) -> tuple[bool, ...]:
    if model_type == "qwen3_5":
        return (False,) * n_layers
    if model_type == "qwen3_5_moe":
        return (True,) * n_layers
    mlp_only = set(text.get("mlp_only_layers", [], list))
    step = _positive(text, "decoder_sparse_step", text.get("decoder_sparse_step", 1))
    return tuple(i not in mlp_only and (i + 1) % step == 0 for i in range(n_layers))


def _validate(cfg: ModelConfig, text: _Fields) -> None:
    src = text.source
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ConfigError(
            f"{src}: num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({cfg.num_key_value_heads})"
        )
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ConfigError(
            f"{src}: linear_num_value_heads ({cfg.linear_num_value_heads}) must be a multiple of "
            f"linear_num_key_heads ({cfg.linear_num_key_heads})"
        )
    if cfg.rotary_dim % 2:
        raise ConfigError(f"{src}: rotary dim head_dim*partial_rotary_factor = {cfg.rotary_dim} must be even")
    if cfg.mrope_section is not None and sum(cfg.mrope_section) != cfg.rotary_dim // 2:
        raise ConfigError(
            f"{src}: mrope_section {list(cfg.mrope_section)} sums to {sum(cfg.mrope_section)}, "
            f"expected rotary_dim/2 = {cfg.rotary_dim // 2}"
        )
    if cfg.hidden_act != "silu":
        raise ConfigError(f"{src}: hidden_act {cfg.hidden_act!r} is not supported (expected 'silu')")
    if not math.isfinite(cfg.rope_theta) or cfg.rope_theta <= 0:
        raise ConfigError(f"{src}: rope_theta must be a positive number, found {cfg.rope_theta}")
