"""Synthetic checkpoints: published layout (checked against transformers), determinism, sharding, dtypes, layouts."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from deltaserve.model.config import ModelConfig
from deltaserve.synthetic import PRESETS, get_preset, make_checkpoint
from deltaserve.synthetic.init import Rng
from deltaserve.synthetic.layout import checkpoint_tensors
from deltaserve.synthetic.writer import INDEX_NAME, plan_shards

transformers = pytest.importorskip("transformers")
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

TINY = ["tiny-moe", "tiny-dense", "tiny-next"]
HF_CLASSES = {
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_next": "Qwen3NextForCausalLM",
}
PROMPT = (
    "The engine serves hybrid language models. A request arrives, the scheduler decides which tokens run next, "
    "and the sampler picks the next token: 3.14159, naïve café, 中文文本."
)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """tiny preset name -> checkpoint directory (default seed, dtype and layout), written once per module."""
    root = tmp_path_factory.mktemp("synthetic")
    return {name: make_checkpoint(root / name, name, progress=False) for name in TINY}


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    index = json.loads((path / INDEX_NAME).read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(path / shard), "pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
    return out


def shard_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


# ---- files, index, determinism -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_index_covers_every_tensor(tiny_ckpt, name):
    path = tiny_ckpt[name]
    index = json.loads((path / INDEX_NAME).read_text())
    shards = shard_files(path)
    assert len(shards) > 1
    n = len(shards)
    assert [s.name for s in shards] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    seen, total = {}, 0
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            assert f.metadata() == {"format": "pt"}
            for key in f.keys():
                assert key not in seen, f"{key} stored twice"
                seen[key] = shard.name
                t = f.get_tensor(key)
                total += t.numel() * t.element_size()
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == total
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (path / file).is_file()


def test_same_seed_same_bytes_different_seed_different(tmp_path):
    a = make_checkpoint(tmp_path / "a", "tiny-moe", seed=0, progress=False)
    b = make_checkpoint(tmp_path / "b", "tiny-moe", seed=0, progress=False)
    c = make_checkpoint(tmp_path / "c", "tiny-moe", seed=1, progress=False)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ta, tc = read_checkpoint(a), read_checkpoint(c)
    assert ta.keys() == tc.keys()
    assert all(not torch.equal(ta[k], tc[k]) for k in ta)  # every tensor depends on the seed
    assert (a / "config.json").read_bytes() == (c / "config.json").read_bytes()


def test_values_do_not_depend_on_order_or_sharding(tmp_path):
    """A tensor is a function of (seed, name) only: a different shard size stores the same values, and generating a
    single spec on its own reproduces the stored tensor."""
    a = read_checkpoint(make_checkpoint(tmp_path / "a", "tiny-dense", seed=3, progress=False))
    b = read_checkpoint(make_checkpoint(tmp_path / "b", "tiny-dense", seed=3, shard_bytes=64 << 10, progress=False))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    preset = get_preset("tiny-dense")
    cfg = ModelConfig.from_dict(preset.config)
    specs = checkpoint_tensors(cfg, preset.vision, "fused", 1)
    for spec in reversed(specs[-5:]):
        assert torch.equal(spec.make(Rng(3)).to(a[spec.name].dtype), a[spec.name])


def test_rewrite_removes_stale_shards(tmp_path):
    make_checkpoint(tmp_path, "tiny-dense", shard_bytes=64 << 10, progress=False)
    many = len(shard_files(tmp_path))
    make_checkpoint(tmp_path, "tiny-dense", progress=False)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert len(shard_files(tmp_path)) < many
    assert {s.name for s in shard_files(tmp_path)} == set(index["weight_map"].values())
    assert not list(tmp_path.glob("*.tmp"))


def test_plan_respects_shard_size():
    preset = get_preset("tiny-moe")
    specs = checkpoint_tensors(ModelConfig.from_dict(preset.config), preset.vision, "fused", 1)
    limit = 100_000
    shards = plan_shards(specs, torch.bfloat16, limit)
    assert [s for shard in shards for s in shard] == specs
    for shard in shards:
        size = sum(s.nbytes(torch.bfloat16) for s in shard)
        assert size <= limit or len(shard) == 1  # only a tensor larger than the limit gets an oversized shard


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(KeyError, match="unknown synthetic preset 'tiny-xl'; known presets: qwen3.6-35b-a3b"):
        make_checkpoint(tmp_path, "tiny-xl")
    with pytest.raises(ValueError, match="dtype must be one of .* found 'fp16'"):
        make_checkpoint(tmp_path, "tiny-moe", dtype="fp16")
    with pytest.raises(ValueError, match="expert_layout must be one of .* found 'stacked'"):
        make_checkpoint(tmp_path, "tiny-moe", expert_layout="stacked")
    with pytest.raises(ValueError, match="shard_bytes must be positive, found 0"):
        make_checkpoint(tmp_path, "tiny-moe", shard_bytes=0)


# ---- dtypes and values -----------------------------------------------------------------------------------------


def test_bf16_checkpoint_keeps_a_log_f32(tiny_ckpt):
    tensors = read_checkpoint(tiny_ckpt["tiny-moe"])
    for name, t in tensors.items():
        assert t.dtype == (torch.float32 if name.endswith(".A_log") else torch.bfloat16), name
    assert sum(name.endswith(".A_log") for name in tensors) == 6  # 6 GDN layers of 8


def test_fp32_checkpoint(tmp_path):
    path = make_checkpoint(tmp_path, "tiny-moe", dtype="fp32", progress=False)
    assert all(t.dtype == torch.float32 for t in read_checkpoint(path).values())
    raw = json.loads((path / "config.json").read_text())
    assert raw["dtype"] == raw["text_config"]["dtype"] == raw["vision_config"]["dtype"] == "float32"
    assert ModelConfig.from_dir(path).dtype == "float32"


def test_initial_values_are_scaled(tiny_ckpt):
    t = {k: v.float() for k, v in read_checkpoint(tiny_ckpt["tiny-moe"]).items()}
    p = "model.language_model.layers.0"
    a_log = torch.cat([v for k, v in t.items() if k.endswith("A_log")])
    assert a_log.min() >= 0 and a_log.max() <= math.log(16) and a_log.std() > 0.3  # A = exp(A_log) in [1, 16]
    dt_bias = torch.cat([v for k, v in t.items() if k.endswith("dt_bias")])
    assert abs(dt_bias.mean() - 1) < 0.1
    norms = torch.cat([v for k, v in t.items() if k.endswith("layernorm.weight")])
    assert abs(norms.mean()) < 0.02 and 0.05 < norms.std() < 0.2  # zero-centred, applied as 1 + w
    gated = t[f"{p}.linear_attn.norm.weight"]
    assert abs(gated.mean() - 1) < 0.1  # applied as w
    for name, fan_in in [(f"{p}.linear_attn.in_proj_qkv.weight", 64), (f"{p}.linear_attn.out_proj.weight", 64),
                         (f"{p}.mlp.experts.down_proj", 32)]:  # fmt: skip
        assert abs(t[name].std() * math.sqrt(fan_in) - 1) < 0.1, name


def test_per_expert_layout_cuts_the_fused_banks(tmp_path, tiny_ckpt):
    fused = read_checkpoint(tiny_ckpt["tiny-moe"])
    per = read_checkpoint(make_checkpoint(tmp_path, "tiny-moe", expert_layout="per_expert", progress=False))
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in per)
    inter = 32
    for name, bank in fused.items():
        if name.endswith("experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            for e in range(bank.shape[0]):
                assert torch.equal(per[f"{p}{e}.gate_proj.weight"], bank[e, :inter])
                assert torch.equal(per[f"{p}{e}.up_proj.weight"], bank[e, inter:])
                assert torch.equal(per[f"{p}{e}.down_proj.weight"], fused[f"{p}down_proj"][e])
        elif not name.endswith("experts.down_proj"):
            assert torch.equal(per[name], bank), name
    assert any(k.startswith("mtp.layers.0.mlp.experts.7.") for k in per)


# ---- against transformers ------------------------------------------------------------------------------------


def _hf_model(path: Path):
    raw = json.loads((path / "config.json").read_text())
    cls = getattr(transformers, HF_CLASSES[raw["model_type"]])
    model, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize("name", TINY)
def test_loads_in_transformers_with_every_key_used(tiny_ckpt, name):
    path = tiny_ckpt[name]
    model, info = _hf_model(path)
    assert {k: v for k, v in info.items() if v} == {}  # no missing, unexpected, mismatched keys
    stored = set(read_checkpoint(path))
    expected = set(model.state_dict())
    if model.config.get_text_config().tie_word_embeddings:
        expected.discard("lm_head.weight")  # tied: not stored, as published
    mtp = {k for k in stored if k.startswith("mtp.")}
    # transformers fuses per-expert tensors (Qwen3-Next) into its experts.gate_up_proj / experts.down_proj
    fused_names = {re.sub(r"experts\.\d+\.(gate|up)_proj\.weight$", "experts.gate_up_proj", k) for k in stored - mtp}
    fused_names = {re.sub(r"experts\.\d+\.down_proj\.weight$", "experts.down_proj", k) for k in fused_names}
    assert fused_names == expected
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
            "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= mtp  # fmt: skip


@pytest.mark.parametrize("name", TINY)
def test_transformers_logits_finite_and_varied(tiny_ckpt, name):
    path = tiny_ckpt[name]
    model, _ = _hf_model(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    routed = model.config.get_text_config().num_experts if hasattr(model.config.get_text_config(), "num_experts") else 0
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, output_router_logits=bool(routed))
    logits = out.logits[0]
    T = ids.shape[1]
    assert torch.isfinite(logits).all()
    assert 0.3 < logits.std() < 5
    assert len(set(logits.argmax(-1).tolist())) > T // 2  # predictions depend on the token and position
    for layer, h in enumerate(out.hidden_states):  # residual stream stays O(1) through every layer
        rms = h[0].pow(2).mean().sqrt()
        assert 0.05 < rms < 10, f"layer {layer}: rms {rms}"
    if routed:
        for layer, r in enumerate(out.router_logits):
            picked = r.reshape(T, -1).topk(2, dim=-1).indices.unique().numel()
            assert picked >= 6, f"layer {layer}: only {picked} of {routed} experts chosen"


@pytest.mark.parametrize("name", TINY)
def test_our_parser_agrees_with_transformers_config(tiny_ckpt, name):
    path = tiny_ckpt[name]
    ours = ModelConfig.from_dir(path)
    _assert_same_numbers(ours, transformers.AutoConfig.from_pretrained(path))


def _assert_same_numbers(ours: ModelConfig, hf) -> None:
    t = hf.get_text_config()
    assert ours.hidden_size == t.hidden_size and ours.num_hidden_layers == t.num_hidden_layers
    assert list(ours.layer_types) == list(t.layer_types)
    assert (ours.num_attention_heads, ours.num_key_value_heads, ours.head_dim) == (
        t.num_attention_heads, t.num_key_value_heads, t.head_dim)  # fmt: skip
    assert ours.linear_num_key_heads == t.linear_num_key_heads
    assert ours.linear_num_value_heads == t.linear_num_value_heads
    assert (ours.linear_key_head_dim, ours.linear_value_head_dim) == (t.linear_key_head_dim, t.linear_value_head_dim)
    assert ours.linear_conv_kernel_dim == t.linear_conv_kernel_dim and ours.vocab_size == t.vocab_size
    assert ours.rms_norm_eps == t.rms_norm_eps
    rope = t.rope_parameters
    assert ours.rope_theta == rope["rope_theta"] and ours.partial_rotary_factor == rope["partial_rotary_factor"]
    assert ours.mrope_section == (tuple(rope["mrope_section"]) if "mrope_section" in rope else None)
    if ours.is_moe:
        assert (ours.num_experts, ours.num_experts_per_tok) == (t.num_experts, t.num_experts_per_tok)
        assert ours.moe_intermediate_size == t.moe_intermediate_size
        assert ours.shared_expert_intermediate_size == t.shared_expert_intermediate_size
    else:
        assert ours.intermediate_size == t.intermediate_size
    assert ours.tie_word_embeddings == hf.tie_word_embeddings


def test_qwen3_next_fused_projections_follow_group_layout(tiny_ckpt):
    """transformers' own unpacking (fix_query_key_value_ordering) of the stored in_proj_qkvz / in_proj_ba gives back
    the logical q, k, v, z, b, a blocks the writer interleaved."""
    path = tiny_ckpt["tiny-next"]
    model, _ = _hf_model(path)
    gdn = model.model.layers[0].linear_attn
    stored = read_checkpoint(path)
    p = "model.layers.0.linear_attn"
    qkvz, ba = stored[f"{p}.in_proj_qkvz.weight"].float(), stored[f"{p}.in_proj_ba.weight"].float()
    q, k, v, z, b, a = gdn.fix_query_key_value_ordering(qkvz.T[None], ba.T[None])  # input columns as "tokens"
    H, kd = 64, 32
    rng = Rng(0)
    qkv_logical = rng.linear(f"{p}.in_proj_qkv.weight", (2 * kd + 64, H)).bfloat16().float()
    as_rows = lambda x: x[0].reshape(H, -1).T  # [1, H, heads, d] -> [heads*d, H]  # noqa: E731
    assert torch.equal(as_rows(q), qkv_logical[:kd]) and torch.equal(as_rows(k), qkv_logical[kd : 2 * kd])
    assert torch.equal(as_rows(v), qkv_logical[2 * kd :])
    assert torch.equal(as_rows(z), rng.linear(f"{p}.in_proj_z.weight", (64, H)).bfloat16().float())
    assert torch.equal(b[0].T, rng.linear(f"{p}.in_proj_b.weight", (4, H)).bfloat16().float())
    assert torch.equal(a[0].T, rng.linear(f"{p}.in_proj_a.weight", (4, H)).bfloat16().float())


# ---- the published-size presets (config only, and the layout without writing weights) --------------------------


@pytest.mark.parametrize("name", ["qwen3.6-35b-a3b", "qwen3.5-0.8b"])
def test_config_only_published_presets(tmp_path, name):
    path = make_checkpoint(tmp_path, name, config_only=True, progress=False)
    assert not shard_files(path) and not (path / INDEX_NAME).exists()
    hf = transformers.AutoConfig.from_pretrained(path)
    ours = ModelConfig.from_dir(path)
    _assert_same_numbers(ours, hf)
    t = hf.get_text_config()
    if name == "qwen3.6-35b-a3b":
        assert type(hf).__name__ == "Qwen3_5MoeConfig"
        assert (t.hidden_size, t.num_hidden_layers, t.num_experts, t.num_experts_per_tok) == (2048, 40, 256, 8)
        assert t.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 10
        assert (t.num_attention_heads, t.num_key_value_heads, t.linear_num_value_heads) == (16, 2, 32)
        assert hf.vision_config.depth == 27 and hf.vision_config.out_hidden_size == 2048
        assert not hf.tie_word_embeddings
    else:
        assert type(hf).__name__ == "Qwen3_5Config"
        assert (t.hidden_size, t.num_hidden_layers, t.intermediate_size) == (1024, 24, 3584)
        assert (t.num_attention_heads, t.linear_num_value_heads) == (8, 16)
        assert hf.vision_config.depth == 12 and hf.vision_config.out_hidden_size == 1024
        assert hf.tie_word_embeddings
    assert t.rope_parameters["mrope_section"] == [11, 11, 10] and t.rope_parameters["rope_theta"] == 1e7
    assert (hf.image_token_id, hf.video_token_id) == (248056, 248057)
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [248046, 248044]


@pytest.mark.parametrize("name", ["qwen3.6-35b-a3b", "qwen3.5-0.8b"])
def test_published_layout_matches_transformers_shapes(name):
    """Names and shapes of the full-size presets equal transformers' (built on the meta device, no memory)."""
    preset = get_preset(name)
    cfg = ModelConfig.from_dict(preset.config)
    specs = {s.name: s.shape for s in checkpoint_tensors(cfg, preset.vision, "fused", cfg.mtp_num_hidden_layers)}
    hf_cfg = getattr(transformers, HF_CLASSES[cfg.model_type].replace("ForConditionalGeneration", "Config"))(
        **preset.config
    )
    with torch.device("meta"):
        model = getattr(transformers, HF_CLASSES[cfg.model_type])(hf_cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        del expected["lm_head.weight"]
    assert {k: v for k, v in specs.items() if not k.startswith("mtp.")} == expected
    assert sum(k.startswith("model.visual.") for k in specs) == 3 + 12 * preset.vision.depth + 6


def test_qwen36_35b_a3b_spec_shapes():
    """Spot checks against the spec tables (2.2 - 2.4) and the published size (~71.9 GB in bf16)."""
    preset = get_preset("qwen3.6-35b-a3b")
    cfg = ModelConfig.from_dict(preset.config)
    specs = checkpoint_tensors(cfg, preset.vision, "fused", 1)
    s = {x.name: x.shape for x in specs}
    p = "model.language_model.layers."
    assert s[p + "0.linear_attn.in_proj_qkv.weight"] == (8192, 2048)
    assert s[p + "0.linear_attn.conv1d.weight"] == (8192, 1, 4)
    assert s[p + "0.linear_attn.A_log"] == (32,) and s[p + "0.linear_attn.norm.weight"] == (128,)
    assert s[p + "3.self_attn.q_proj.weight"] == (8192, 2048) and s[p + "3.self_attn.o_proj.weight"] == (2048, 4096)
    assert s[p + "39.mlp.experts.gate_up_proj"] == (256, 1024, 2048)
    assert s[p + "39.mlp.experts.down_proj"] == (256, 2048, 512)
    assert s["mtp.fc.weight"] == (2048, 4096) and s["mtp.layers.0.mlp.experts.gate_up_proj"] == (256, 1024, 2048)
    assert s["model.visual.patch_embed.proj.weight"] == (1152, 3, 2, 16, 16)
    assert s["model.visual.merger.linear_fc1.weight"] == (4608, 4608)
    assert s["model.visual.merger.linear_fc2.weight"] == (2048, 4608)
    total = sum(x.nbytes(torch.bfloat16) for x in specs)
    assert 71.5e9 < total < 72.5e9
    per_expert = checkpoint_tensors(cfg, preset.vision, "per_expert", 1)
    assert sum(".mlp.experts." in x.name for x in per_expert) == (40 + 1) * 256 * 3


def test_presets_are_independent_copies():
    a = get_preset("tiny-moe")
    a.config["text_config"]["hidden_size"] = 1
    assert PRESETS["tiny-moe"].config["text_config"]["hidden_size"] == 64
