"""Presets: the full config.json of each synthetic checkpoint, in the published structure.

Two presets copy published models field for field (values from the spec, sections 1.2 and 1.3):
`qwen3.6-35b-a3b` (qwen3_5_moe) and `qwen3.5-0.8b` (qwen3_5, tied embeddings); two more give the text shapes
of the larger MoE releases (spec 1.4: `qwen3.5-122b-a10b`, `qwen3.5-397b-a17b`), for config-only use. Three tiny
presets keep the same structure at shapes that run in seconds on a CPU: `tiny-moe`, `tiny-dense` and `tiny-next`
(the flat qwen3_next config). Every token id a config names (eos, bos, image/video/vision ids) comes from
`SPECIAL_TOKENS` placed after the BPE vocabulary of the preset's tokenizer, so config and tokenizer agree.

A preset is data only; `writer.make_checkpoint` turns it into files.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

# The 26 added tokens, in id order, directly after the ordinary BPE vocabulary (spec section 5:
# 248044 <|endoftext|> ... 248069 </think> for the published tokenizer; Qwen2.5/Qwen3 use the same order).
# The second field is the tokenizer's "special" flag: the tool/think tags and FIM tokens are plain added tokens
# (they stay visible when decoding with skip_special_tokens).
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

PUBLISHED_BPE_SIZE = 248044  # ordinary vocabulary of the Qwen3.5/3.6 tokenizer; added tokens start here
TINY_BPE_SIZE = 1000  # ordinary vocabulary of the tiny tokenizer (trained on tokenizer.TRAINING_TEXT)


def special_ids(bpe_size: int) -> dict[str, int]:
    """Token -> id for the added tokens of a tokenizer whose BPE vocabulary has `bpe_size` entries."""
    return {tok: bpe_size + i for i, (tok, _) in enumerate(SPECIAL_TOKENS)}


@dataclass(frozen=True)
class VisionDims:
    """The vision tower shape; `vision_config()` spells it the published way."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int = 2304  # a sqrt x sqrt learned grid (48 x 48 published)
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3


@dataclass(frozen=True)
class Preset:
    name: str
    config: dict  # the whole config.json, published structure
    bpe_size: int  # ordinary BPE vocabulary size of the tokenizer; added tokens follow
    vision: VisionDims | None  # None for qwen3_next (no vision tower)
    shard_bytes: int  # default shard size for make_checkpoint
    expert_layout: str  # published storage of routed experts: "fused" | "per_expert"
    thinking_default: bool = True  # chat template: think unless enable_thinking=False
    # MTP layers to write; None = the config's mtp_num_hidden_layers. Qwen3-Next checkpoints carry `mtp.*`
    # tensors although their config has no MTP field.
    mtp_layers: int | None = None
    generation: dict = field(default_factory=dict)  # generation_config.json

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def special_ids(self) -> dict[str, int]:
        return special_ids(self.bpe_size)


# ---- config builders -------------------------------------------------------------------------------------------


def _layer_types(n_layers: int, interval: int = 4) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def _rope_parameters(theta: float, partial: float, mrope_section: list[int]) -> dict:
    return {
        "mrope_interleaved": True,
        "mrope_section": list(mrope_section),
        "partial_rotary_factor": partial,
        "rope_theta": theta,
        "rope_type": "default",
    }


def _vision_config(v: VisionDims, model_type: str, extra: dict) -> dict:
    cfg = {
        "deepstack_visual_indexes": [],  # Qwen3.5/3.6 have no deepstack
        "depth": v.depth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": v.hidden_size,
        "in_channels": v.in_channels,
        "initializer_range": 0.02,
        "intermediate_size": v.intermediate_size,
        "model_type": model_type,
        "num_heads": v.num_heads,
        "num_position_embeddings": v.num_position_embeddings,
        "out_hidden_size": v.out_hidden_size,
        "patch_size": v.patch_size,
        "spatial_merge_size": v.spatial_merge_size,
        "temporal_patch_size": v.temporal_patch_size,
    }
    cfg.update(extra)
    return dict(sorted(cfg.items()))


def _nested_config(
    arch: str, model_type: str, text: dict, vision: dict, ids: dict[str, int], tie: bool, top: dict
) -> dict:
    """Top-level qwen3_5 / qwen3_5_moe config around a text_config and a vision_config."""
    cfg = {
        "architectures": [arch],
        "image_token_id": ids["<|image_pad|>"],
        "model_type": model_type,
        "text_config": dict(sorted(text.items())),
        "tie_word_embeddings": tie,
        "video_token_id": ids["<|video_pad|>"],
        "vision_config": vision,
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
    }
    cfg.update(top)
    return dict(sorted(cfg.items()))


def _generation(ids: dict[str, int], bos: bool = True) -> dict:
    """generation_config.json: stop on <|im_end|> and <|endoftext|>, the published sampling defaults."""
    gen = {
        "do_sample": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.57.1",
    }
    if bos:
        gen["bos_token_id"] = ids["<|endoftext|>"]
    return dict(sorted(gen.items()))


def _text_common(
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    lin_k_heads: int,
    lin_v_heads: int,
    lin_dim: int,
    vocab: int,
    tie: bool,
    max_pos: int,
    rope: dict,
    model_type: str,
) -> dict:
    """text_config fields shared by the dense and MoE models (names and values as published)."""
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "full_attention_interval": 4,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "layer_types": _layer_types(layers),
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": lin_dim,
        "linear_num_key_heads": lin_k_heads,
        "linear_num_value_heads": lin_v_heads,
        "linear_value_head_dim": lin_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": max_pos,
        "model_type": model_type,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "partial_rotary_factor": rope["partial_rotary_factor"],
        "rms_norm_eps": 1e-06,
        "rope_parameters": rope,
        "tie_word_embeddings": tie,
        "use_cache": True,
        "vocab_size": vocab,
    }


def _moe_fields(experts: int, top_k: int, expert_inter: int, shared_inter: int) -> dict:
    return {
        "moe_intermediate_size": expert_inter,
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": shared_inter,
    }


# ---- the published models -------------------------------------------------------------------------------------


def _qwen_moe(name: str, hidden: int, layers: int, heads: int, lin_v_heads: int, experts: int, top_k: int,
              expert_inter: int) -> Preset:
    """A published MoE size of spec section 1.4: Qwen3.6-35B-A3B (the flagship), and the larger Qwen3.5-122B-A10B
    and Qwen3.5-397B-A17B for config-only use (`deltaserve info`, `--config-only`, GGUF shapes). Text fields as
    published; the larger models' vision tower beyond its output width is not published (spec: UNCERTAIN), so the
    35B-A3B tower is assumed for them."""
    ids = special_ids(PUBLISHED_BPE_SIZE)
    vision = VisionDims(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=hidden)
    text = _text_common(
        hidden=hidden, layers=layers, heads=heads, kv_heads=2, head_dim=256, lin_k_heads=16, lin_v_heads=lin_v_heads,
        lin_dim=128, vocab=248320, tie=False, max_pos=262144, rope=_rope_parameters(10000000, 0.25, [11, 11, 10]),
        model_type="qwen3_5_moe_text",
    )  # fmt: skip
    text.update(_moe_fields(experts, top_k, expert_inter, expert_inter))
    text.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"], pad_token_id=None)
    cfg = _nested_config(
        "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", text,
        _vision_config(vision, "qwen3_5_moe_vision", {"dtype": "bfloat16"}), ids, tie=False,
        top={"dtype": "bfloat16", "transformers_version": "4.57.1"},
    )  # fmt: skip
    return Preset(name, cfg, PUBLISHED_BPE_SIZE, vision, shard_bytes=4 << 30, expert_layout="fused",
                  generation=_generation(ids))


def _qwen36_35b_a3b() -> Preset:
    return _qwen_moe("qwen3.6-35b-a3b", 2048, 40, 16, 32, 256, 8, 512)


def _qwen35_122b_a10b() -> Preset:
    return _qwen_moe("qwen3.5-122b-a10b", 3072, 48, 32, 64, 256, 8, 1024)


def _qwen35_397b_a17b() -> Preset:
    return _qwen_moe("qwen3.5-397b-a17b", 4096, 60, 32, 64, 512, 10, 1024)


def _qwen35_0_8b() -> Preset:
    ids = special_ids(PUBLISHED_BPE_SIZE)
    vision = VisionDims(depth=12, hidden_size=768, num_heads=12, intermediate_size=3072, out_hidden_size=1024)
    text = _text_common(
        hidden=1024, layers=24, heads=8, kv_heads=2, head_dim=256, lin_k_heads=16, lin_v_heads=16, lin_dim=128,
        vocab=248320, tie=True, max_pos=262144, rope=_rope_parameters(10000000, 0.25, [11, 11, 10]),
        model_type="qwen3_5_text",
    )  # fmt: skip
    # The published 0.8B text_config has no partial_rotary_factor at the top level (only inside rope_parameters),
    # an empty mlp_only_layers list, eos but no bos.
    del text["partial_rotary_factor"]
    text.update(intermediate_size=3584, mlp_only_layers=[], eos_token_id=ids["<|endoftext|>"])
    cfg = _nested_config(
        "Qwen3_5ForConditionalGeneration", "qwen3_5", text,
        _vision_config(vision, "qwen3_5", {}), ids, tie=True,  # old-style vision model_type, as published
        top={"transformers_version": "4.57.0.dev0"},
    )  # fmt: skip
    # The 0.8B/2B templates reportedly default to thinking OFF (spec section 5, UNCERTAIN).
    return Preset(
        "qwen3.5-0.8b", cfg, PUBLISHED_BPE_SIZE, vision, shard_bytes=4 << 30, expert_layout="fused",
        thinking_default=False, generation=_generation(ids),
    )  # fmt: skip


# ---- tiny presets (seconds on CPU) ----------------------------------------------------------------------------

TINY_VOCAB = 1088  # embedding rows: TINY_BPE_SIZE + 26 added tokens, padded to a multiple of 64 (as 248320 is)
TINY_SHARD_BYTES = 512 << 10  # small enough that every tiny checkpoint has several shards
# rope_theta 1e4 rather than the published 1e7: with rotary_dim 8 there are only 4 frequencies, and 1e7 would
# leave three of them nearly constant over short test sequences (a RoPE bug would then go unnoticed).
TINY_ROPE = _rope_parameters(10000.0, 0.25, [2, 1, 1])  # head_dim 32 -> rotary 8 -> 4 frequencies = 2+1+1
TINY_VISION = VisionDims(
    depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, num_position_embeddings=64
)


def _tiny_text(model_type: str, lin_v_heads: int, tie: bool, ids: dict[str, int]) -> dict:
    text = _text_common(
        hidden=64, layers=8, heads=4, kv_heads=2, head_dim=32, lin_k_heads=2, lin_v_heads=lin_v_heads, lin_dim=16,
        vocab=TINY_VOCAB, tie=tie, max_pos=4096, rope=copy.deepcopy(TINY_ROPE), model_type=model_type,
    )  # fmt: skip
    text.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"], pad_token_id=None)
    return text


def _tiny_moe() -> Preset:
    ids = special_ids(TINY_BPE_SIZE)
    text = _tiny_text("qwen3_5_moe_text", lin_v_heads=4, tie=False, ids=ids)  # Hv/Hk = 2 as in 35B-A3B
    text.update(_moe_fields(8, 2, 32, 32))
    cfg = _nested_config(
        "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", text,
        _vision_config(TINY_VISION, "qwen3_5_moe_vision", {"dtype": "bfloat16"}), ids, tie=False,
        top={"dtype": "bfloat16", "transformers_version": "4.57.1"},
    )  # fmt: skip
    return Preset(
        "tiny-moe", cfg, TINY_BPE_SIZE, TINY_VISION, TINY_SHARD_BYTES, "fused", generation=_generation(ids)
    )


def _tiny_dense() -> Preset:
    ids = special_ids(TINY_BPE_SIZE)
    text = _tiny_text("qwen3_5_text", lin_v_heads=2, tie=True, ids=ids)  # Hv/Hk = 1 and tied, as in 0.8B
    text.update(intermediate_size=128, mlp_only_layers=[])
    cfg = _nested_config(
        "Qwen3_5ForConditionalGeneration", "qwen3_5", text,
        _vision_config(TINY_VISION, "qwen3_5_vision", {"dtype": "bfloat16"}), ids, tie=True,
        top={"dtype": "bfloat16", "transformers_version": "4.57.1"},
    )  # fmt: skip
    return Preset(
        "tiny-dense", cfg, TINY_BPE_SIZE, TINY_VISION, TINY_SHARD_BYTES, "fused", generation=_generation(ids)
    )


def _tiny_next() -> Preset:
    """Flat qwen3_next config (Qwen3-Next-80B-A3B structure): no text_config, no layer_types (derived from
    full_attention_interval), plain 1-D partial RoPE, norm_topk_prob, Qwen3 token ids (bos <|endoftext|>,
    eos <|im_end|>)."""
    ids = special_ids(TINY_BPE_SIZE)
    cfg = {
        "architectures": ["Qwen3NextForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "decoder_sparse_step": 1,
        "eos_token_id": ids["<|im_end|>"],
        "full_attention_interval": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 160,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 16,
        "max_position_embeddings": 4096,
        "mlp_only_layers": [],
        "model_type": "qwen3_next",
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_hidden_layers": 8,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": TINY_VOCAB,
    }
    cfg.update(_moe_fields(8, 2, 32, 32))
    gen = _generation(ids)
    return Preset(
        "tiny-next", dict(sorted(cfg.items())), TINY_BPE_SIZE, None, TINY_SHARD_BYTES, "per_expert",
        mtp_layers=1, generation=gen,
    )  # fmt: skip


_BUILDERS = {
    "qwen3.6-35b-a3b": _qwen36_35b_a3b,
    "qwen3.5-0.8b": _qwen35_0_8b,
    "qwen3.5-122b-a10b": _qwen35_122b_a10b,  # config-only sizes (spec 1.4): `deltaserve info`, tensor parallelism
    "qwen3.5-397b-a17b": _qwen35_397b_a17b,
    "tiny-moe": _tiny_moe,
    "tiny-dense": _tiny_dense,
    "tiny-next": _tiny_next,
}
PRESETS: dict[str, Preset] = {name: build() for name, build in _BUILDERS.items()}


def get_preset(name: str | Preset) -> Preset:
    """The preset called `name` (a fresh deep copy, so callers may edit its config)."""
    if isinstance(name, Preset):
        return name
    if name not in PRESETS:
        raise KeyError(f"unknown synthetic preset {name!r}; known presets: {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
