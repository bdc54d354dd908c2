"""ModelConfig parser: the three families, layer_types vs full_attention_interval, partial rotary + MRoPE, errors."""

from __future__ import annotations

import copy
import json

import pytest

from deltaserve.model.config import FULL_ATTENTION, LINEAR_ATTENTION, ConfigError, ModelConfig
from deltaserve.synthetic.presets import PRESETS


def _cfg(name: str) -> dict:
    return copy.deepcopy(PRESETS[name].config)


def test_qwen3_5_moe_published_values():
    c = ModelConfig.from_dict(_cfg("qwen3.6-35b-a3b"))
    assert c.model_type == "qwen3_5_moe" and c.is_moe
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (2048, 40, 248320)
    assert c.full_attention_layers == list(range(3, 40, 4))
    assert len(c.linear_attention_layers) == 30
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 2, 256)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (16, 32)
    assert (c.key_dim, c.value_dim, c.conv_dim) == (2048, 4096, 8192)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (256, 8, 512)
    assert c.shared_expert_intermediate_size == 512 and c.norm_topk_prob
    assert c.sparse_layers == (True,) * 40 and c.intermediate_size is None
    assert c.rope_theta == 1e7 and c.rotary_dim == 64
    assert c.mrope_section == (11, 11, 10) and c.mrope_interleaved
    assert c.eos_token_ids == (248044,) and c.bos_token_id == 248044 and c.pad_token_id is None
    assert not c.tie_word_embeddings and c.mtp_num_hidden_layers == 1 and c.dtype == "bfloat16"
    assert (c.image_token_id, c.video_token_id) == (248056, 248057)
    assert (c.vision_start_token_id, c.vision_end_token_id) == (248053, 248054)
    assert c.vision_config["depth"] == 27 and c.vision_config["out_hidden_size"] == 2048


def test_qwen3_5_dense_published_values():
    c = ModelConfig.from_dict(_cfg("qwen3.5-0.8b"))
    assert c.model_type == "qwen3_5" and not c.is_moe and c.num_experts == 0
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (1024, 24, 3584)
    assert c.sparse_layers == (False,) * 24
    assert c.full_attention_layers == [3, 7, 11, 15, 19, 23]
    assert (c.num_attention_heads, c.num_key_value_heads) == (8, 2)
    assert c.linear_num_key_heads == c.linear_num_value_heads == 16
    assert c.tie_word_embeddings
    # partial_rotary_factor only inside rope_parameters in the published 0.8B config
    assert "partial_rotary_factor" not in _cfg("qwen3.5-0.8b")["text_config"]
    assert c.partial_rotary_factor == 0.25 and c.rotary_dim == 64
    assert c.bos_token_id is None and c.eos_token_ids == (248044,)


def test_qwen3_next_flat_config():
    raw = _cfg("tiny-next")
    assert "text_config" not in raw and "layer_types" not in raw
    c = ModelConfig.from_dict(raw)
    assert c.model_type == "qwen3_next" and c.is_moe and c.norm_topk_prob
    # layer_types derived from full_attention_interval = 4
    assert c.layer_types == (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,) + (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)
    assert c.mrope_section is None and not c.mrope_interleaved  # plain 1-D partial RoPE
    assert c.rotary_dim == 8 and c.rope_theta == 10000.0
    assert c.eos_token_ids == (1002,) and c.bos_token_id == 1000
    assert c.vision_config is None and c.image_token_id is None
    assert c.dtype == "bfloat16"  # from torch_dtype


def test_qwen3_next_sparse_step_and_mlp_only_layers():
    raw = _cfg("tiny-next")
    raw.update(decoder_sparse_step=2, mlp_only_layers=[5])
    c = ModelConfig.from_dict(raw)
    # sparse iff (i + 1) % step == 0 and i not in mlp_only_layers
    assert c.sparse_layers == (False, True, False, True, False, False, False, True)
    raw.update(norm_topk_prob=False)
    assert not ModelConfig.from_dict(raw).norm_topk_prob


def test_qwen3_next_dense_layers_need_intermediate_size():
    raw = _cfg("tiny-next")
    raw.update(mlp_only_layers=[0])
    del raw["intermediate_size"]
    with pytest.raises(ConfigError, match="'intermediate_size' is missing"):
        ModelConfig.from_dict(raw)


def test_explicit_layer_types_win_over_interval():
    raw = _cfg("tiny-moe")
    pattern = ["full_attention", "linear_attention"] * 4
    raw["text_config"]["layer_types"] = pattern
    raw["text_config"]["full_attention_interval"] = 4
    assert ModelConfig.from_dict(raw).layer_types == tuple(pattern)


@pytest.mark.parametrize("interval, full", [(4, [3, 7]), (2, [1, 3, 5, 7]), (3, [2, 5])])
def test_layer_types_derived_from_interval(interval, full):
    raw = _cfg("tiny-moe")
    del raw["text_config"]["layer_types"]
    raw["text_config"]["full_attention_interval"] = interval
    assert ModelConfig.from_dict(raw).full_attention_layers == full


def test_layer_types_default_interval_is_4():
    raw = _cfg("tiny-dense")
    del raw["text_config"]["layer_types"], raw["text_config"]["full_attention_interval"]
    assert ModelConfig.from_dict(raw).full_attention_layers == [3, 7]


def test_layer_types_errors_name_the_field():
    raw = _cfg("tiny-moe")
    raw["text_config"]["layer_types"] = raw["text_config"]["layer_types"][:7]
    with pytest.raises(ConfigError, match=r"text_config\.layer_types' has 7 entries, expected num_hidden_layers = 8"):
        ModelConfig.from_dict(raw)
    raw = _cfg("tiny-moe")
    raw["text_config"]["layer_types"][2] = "sliding_attention"
    with pytest.raises(ConfigError, match=r"text_config\.layer_types\[2\]' is 'sliding_attention'"):
        ModelConfig.from_dict(raw)


def test_partial_rotary_and_mrope_sections():
    c = ModelConfig.from_dict(_cfg("tiny-moe"))
    assert c.head_dim == 32 and c.partial_rotary_factor == 0.25 and c.rotary_dim == 8
    assert c.mrope_section == (2, 1, 1) and sum(c.mrope_section) == c.rotary_dim // 2
    assert c.mrope_interleaved and c.rope_theta == 10000.0
    raw = _cfg("tiny-moe")
    raw["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.5  # rotary 16 -> needs sections summing to 8
    with pytest.raises(ConfigError, match=r"mrope_section \[2, 1, 1\] sums to 4, expected rotary_dim/2 = 8"):
        ModelConfig.from_dict(raw)
    raw["text_config"]["rope_parameters"]["mrope_section"] = [3, 3, 2]
    c = ModelConfig.from_dict(raw)
    assert c.rotary_dim == 16 and c.mrope_section == (3, 3, 2)


def test_rope_parameters_win_over_flat_rope_fields():
    raw = _cfg("tiny-moe")
    raw["text_config"]["rope_theta"] = 5.0  # stale flat field; rope_parameters is authoritative
    assert ModelConfig.from_dict(raw).rope_theta == 10000.0


def test_unsupported_rope_type():
    raw = _cfg("tiny-moe")
    raw["text_config"]["rope_parameters"]["rope_type"] = "yarn"
    with pytest.raises(ConfigError, match=r"rope_parameters\.rope_type' = 'yarn' is not supported"):
        ModelConfig.from_dict(raw)


def test_unknown_model_type():
    raw = _cfg("tiny-moe")
    raw["model_type"] = "qwen3_moe"
    with pytest.raises(ConfigError, match=r"unknown model_type 'qwen3_moe'.*qwen3_5, qwen3_5_moe, qwen3_next"):
        ModelConfig.from_dict(raw)
    del raw["model_type"]
    with pytest.raises(ConfigError, match="required field 'model_type' is missing"):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize(
    "preset, path",
    [
        ("tiny-moe", ("text_config", "hidden_size")),
        ("tiny-moe", ("text_config", "num_experts")),
        ("tiny-moe", ("text_config", "moe_intermediate_size")),
        ("tiny-moe", ("text_config", "linear_num_value_heads")),
        ("tiny-dense", ("text_config", "intermediate_size")),
        ("tiny-dense", ("text_config", "vocab_size")),
        ("tiny-next", ("num_attention_heads",)),
        ("tiny-next", ("num_experts_per_tok",)),
        ("tiny-moe", ("text_config",)),
    ],
)
def test_missing_required_field_is_named(preset, path):
    raw = _cfg(preset)
    section = raw
    for key in path[:-1]:
        section = section[key]
    del section[path[-1]]
    with pytest.raises(ConfigError, match=rf"required field '{'.'.join(path)}' is missing"):
        ModelConfig.from_dict(raw, source="x/config.json")


def test_wrong_types_and_values_are_named():
    raw = _cfg("tiny-moe")
    raw["text_config"]["hidden_size"] = "64"
    with pytest.raises(ConfigError, match=r"field 'text_config\.hidden_size' should be int, found str '64'"):
        ModelConfig.from_dict(raw)
    raw = _cfg("tiny-moe")
    raw["text_config"]["num_experts_per_tok"] = 9
    with pytest.raises(ConfigError, match=r"num_experts_per_tok' = 9 exceeds num_experts = 8"):
        ModelConfig.from_dict(raw)
    raw = _cfg("tiny-moe")
    raw["text_config"]["linear_num_value_heads"] = 3
    with pytest.raises(ConfigError, match=r"linear_num_value_heads \(3\) must be a multiple of linear_num_key_heads"):
        ModelConfig.from_dict(raw)
    raw = _cfg("tiny-dense")
    raw["text_config"]["num_hidden_layers"] = 0
    with pytest.raises(ConfigError, match=r"text_config\.num_hidden_layers' must be positive, found 0"):
        ModelConfig.from_dict(raw)


def test_from_dir_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=rf"{tmp_path}/config.json: no config.json found"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        ModelConfig.from_dir(tmp_path)
    raw = _cfg("tiny-dense")
    del raw["text_config"]["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=rf"{tmp_path}/config.json: required field 'text_config.num_key_value_heads'"):
        ModelConfig.from_dir(tmp_path)


def test_dtype_falls_back_to_top_level():
    raw = _cfg("tiny-moe")
    del raw["text_config"]["dtype"]
    raw["dtype"] = "float32"
    assert ModelConfig.from_dict(raw).dtype == "float32"


def test_tie_word_embeddings_top_level_or_text():
    raw = _cfg("tiny-dense")
    del raw["tie_word_embeddings"]
    assert ModelConfig.from_dict(raw).tie_word_embeddings  # from text_config
    raw["tie_word_embeddings"] = False
    assert not ModelConfig.from_dict(raw).tie_word_embeddings  # top level wins (transformers reads it there)


def test_model_registry_builds_every_supported_type():
    """model/registry.py: every supported model_type has its class (the loader, quantiser, info and bench build
    through it); an unknown type is refused by name."""
    import torch

    from deltaserve.model.config import SUPPORTED_MODEL_TYPES
    from deltaserve.model.registry import MODELS, build_model, model_class

    assert set(MODELS) == set(SUPPORTED_MODEL_TYPES)
    with pytest.raises(ConfigError, match="no model class for model_type 'llama'"):
        model_class("llama")
    config = ModelConfig.from_dict(PRESETS["tiny-moe"].config)
    with torch.device("meta"):
        model = build_model(config)
    assert type(model) is MODELS[config.model_type] and model.config is config
