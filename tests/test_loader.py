"""load_checkpoint on transformers-written checkpoints: same logits as transformers, layouts, dtypes, set-aside, RSS.

The oracle is transformers itself (fp32, CPU): a random tiny model is written to disk in one of the published
layouts, loaded with `load_checkpoint`, and must give transformers' logits for every position.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deltaserve.model import ForwardBatch, ModelConfig
from deltaserve.weights import CheckpointError, detect_format, load_checkpoint
from model_helpers import make_hf_model
import rss_probe

BLOCK = 16
LM = "model.language_model."


# ---- checkpoint writing helpers (also used by test_loader_errors.py) ------------------------------------------------


def write_checkpoint(path: Path, config: dict, tensors: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """config.json + `shards` safetensors files (with model.safetensors.index.json when shards > 1)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(path / "model.safetensors"))
        return path
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: tensors[n].contiguous() for n in part}, str(path / file))
        weight_map.update({n: file for n in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def fused_tensors(hf_model) -> dict[str, torch.Tensor]:
    """transformers' in-memory names = the published fused layout (experts.gate_up_proj [E, 2I, H])."""
    sd = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    if hf_model.config.get_text_config().tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def per_expert_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rewrite fused experts as experts.{e}.{gate,up,down}_proj.weight (the FP8 / Qwen3-Next layout)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def hf_config(hf_model) -> dict:
    return json.loads(hf_model.config.to_json_string())


@torch.no_grad()
def all_logits(model, ids: list[int]) -> torch.Tensor:
    """Our fp32 logits for every position of one fresh sequence, through the engine contract."""
    cache = model.make_cache(-(-len(ids) // BLOCK), BLOCK, 1, torch.float32)
    batch = ForwardBatch.build([ids], [0], [list(range(-(-len(ids) // BLOCK)))], [0], BLOCK, logits="all")
    return model(batch, cache)


@torch.no_grad()
def assert_same_logits(hf_model, model, seed: int = 0, rel: float = 1e-5) -> None:
    ids = torch.randint(0, hf_model.config.get_text_config().vocab_size, (40,), generator=torch.Generator().manual_seed(seed))
    ref = hf_model(input_ids=ids[None]).logits[0].float()
    ours = all_logits(model, ids.tolist())
    err = (ours - ref).abs().max().item()
    assert err <= rel * ref.abs().max().item(), f"max abs logit error {err} (logit scale {ref.abs().max().item()})"


# ---- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_moe():
    return make_hf_model(moe=True, seed=1)


@pytest.fixture(scope="module")
def hf_dense():
    return make_hf_model(moe=False, seed=2)


# ---- logits match transformers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["fused", "per_expert", "save_pretrained"])
def test_moe_logits_match_transformers(hf_moe, tmp_path, layout):
    if layout == "save_pretrained":  # whatever layout this transformers writes (5.x: per expert), sharded
        hf_moe.save_pretrained(tmp_path, max_shard_size="200KB")
        assert (tmp_path / "model.safetensors.index.json").exists()
    else:
        tensors = fused_tensors(hf_moe)
        write_checkpoint(tmp_path, hf_config(hf_moe), per_expert_tensors(tensors) if layout == "per_expert" else tensors, 3)
    ckpt = load_checkpoint(tmp_path, progress=False)
    assert ckpt.format == "hf" and ckpt.config.is_moe and not ckpt.model.training
    assert set(ckpt.set_aside) == {"visual"}  # the vision tower is recorded, not loaded
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in ckpt.model.parameters())
    assert_same_logits(hf_moe, ckpt.model)


def test_dense_logits_match_transformers(hf_dense, tmp_path):
    write_checkpoint(tmp_path, hf_config(hf_dense), fused_tensors(hf_dense), shards=2)
    ckpt = load_checkpoint(tmp_path, progress=False)
    assert not ckpt.config.is_moe
    assert_same_logits(hf_dense, ckpt.model)


def test_tied_embeddings(tmp_path):
    hf = make_hf_model(moe=False, seed=3, tie=True)
    tensors = fused_tensors(hf)
    assert "lm_head.weight" not in tensors
    write_checkpoint(tmp_path / "plain", hf_config(hf), tensors)
    ckpt = load_checkpoint(tmp_path / "plain", progress=False)
    assert ckpt.model.lm_head is None and "tied_lm_head" not in ckpt.set_aside
    assert_same_logits(hf, ckpt.model)
    # An lm_head copy in a tied checkpoint is set aside (transformers ties it to the embedding, ignoring the copy).
    tensors["lm_head.weight"] = torch.randn_like(tensors[LM + "embed_tokens.weight"])
    write_checkpoint(tmp_path / "extra", hf_config(hf), tensors)
    ckpt = load_checkpoint(tmp_path / "extra", progress=False)
    assert ckpt.set_aside["tied_lm_head"] == ["lm_head.weight"]
    assert_same_logits(hf, ckpt.model)


def test_fused_and_per_expert_load_bit_identical(hf_moe, tmp_path):
    tensors = fused_tensors(hf_moe)
    write_checkpoint(tmp_path / "fused", hf_config(hf_moe), tensors)
    write_checkpoint(tmp_path / "per", hf_config(hf_moe), per_expert_tensors(tensors), shards=4)
    a = load_checkpoint(tmp_path / "fused", progress=False).model.state_dict()
    b = load_checkpoint(tmp_path / "per", progress=False).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    # and both equal the transformers weights they came from
    assert torch.equal(a["layers.0.mlp.experts.gate_up_proj"], tensors[LM + "layers.0.mlp.experts.gate_up_proj"])


# ---- qwen3_next -------------------------------------------------------------------------------------------------------


def make_hf_next(seed: int = 0):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3NextConfig(
        vocab_size=300, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=24, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.25),
    )  # fmt: skip
    model = Qwen3NextForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "A_log" in name or "dt_bias" in name:
                p.add_(torch.randn_like(p) * 0.2)
            elif "mlp.gate.weight" in name or "embed_tokens" in name or "lm_head" in name:
                p.normal_(0, 0.5)
    return model


def test_qwen3_next_flat_checkpoint_matches_transformers(tmp_path):
    """Flat names, per-expert experts, group-interleaved in_proj_qkvz/ba (Hv = 2 Hk, dv != dk), a dense layer."""
    hf = make_hf_next()
    hf.save_pretrained(tmp_path, max_shard_size="300KB")
    ckpt = load_checkpoint(tmp_path, progress=False)
    assert ckpt.config.model_type == "qwen3_next" and ckpt.format == "hf" and not ckpt.set_aside
    assert_same_logits(hf, ckpt.model)
    # the split gives exactly transformers' q, k, v, z rows: check in_proj_qkv against the reordering transformers does
    sd = hf.state_dict()
    qkvz = sd["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    x = torch.randn(3, 64)
    q, k, v, z, b, a = hf.model.layers[0].linear_attn.fix_query_key_value_ordering(
        (x @ qkvz.T)[None], (x @ sd["model.layers.0.linear_attn.in_proj_ba.weight"].T)[None]
    )
    la = ckpt.model.layers[0].linear_attn
    flat = torch.cat([t.reshape(3, -1) for t in (q, k, v)], dim=-1)  # transformers' conv input [Q; K; V]
    torch.testing.assert_close(x @ la.in_proj_qkv.weight.T, flat, rtol=0, atol=1e-6)
    torch.testing.assert_close(x @ la.in_proj_z.weight.T, z.reshape(3, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(x @ la.in_proj_b.weight.T, b.reshape(3, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(x @ la.in_proj_a.weight.T, a.reshape(3, -1), rtol=0, atol=1e-6)


# ---- dtypes, set-aside, detection, progress -----------------------------------------------------------------------------


def test_bf16_checkpoint_dtypes(hf_moe, tmp_path):
    tensors = {k: (v if k.endswith("A_log") else v.bfloat16()) for k, v in fused_tensors(hf_moe).items()}
    write_checkpoint(tmp_path, hf_config(hf_moe), tensors, shards=2)
    native = load_checkpoint(tmp_path, progress=False).model  # dtype None: the checkpoint's dtype (bf16)
    for name, p in native.named_parameters():
        want = torch.float32 if name.endswith(("A_log", "dt_bias")) else torch.bfloat16
        assert p.dtype == want, name
    assert torch.equal(native.embed_tokens.weight, tensors[LM + "embed_tokens.weight"])
    up = load_checkpoint(tmp_path, dtype=torch.float32, progress=False).model
    assert all(p.dtype == torch.float32 for p in up.parameters())
    assert torch.equal(up.embed_tokens.weight, tensors[LM + "embed_tokens.weight"].float())


def test_mtp_and_visual_are_set_aside_and_reported(hf_moe, tmp_path):
    tensors = fused_tensors(hf_moe)
    h = hf_moe.config.text_config.hidden_size
    mtp = {"mtp.fc.weight": torch.randn(h, 2 * h), "mtp.norm.weight": torch.zeros(h), "mtp.layers.0.mlp.gate.weight": torch.randn(8, h)}
    write_checkpoint(tmp_path, hf_config(hf_moe), {**tensors, **mtp}, shards=2)
    ckpt = load_checkpoint(tmp_path, progress=False)
    assert sorted(ckpt.set_aside["mtp"]) == sorted(mtp)
    n_visual = sum(k.startswith("model.visual.") for k in tensors)
    assert len(ckpt.set_aside["visual"]) == n_visual > 0
    info = ckpt.set_aside_info["mtp.fc.weight"]
    assert info.shape == (h, 2 * h) and info.dtype == "F32" and info.file.endswith(".safetensors")
    summary = ckpt.summary()
    assert "mtp: 3 tensors" in summary and f"visual: {n_visual} tensors" in summary


def test_detect_format(hf_moe, tmp_path):
    write_checkpoint(tmp_path, hf_config(hf_moe), fused_tensors(hf_moe))
    config = ModelConfig.from_dir(tmp_path)
    names = list(fused_tensors(hf_moe))
    assert detect_format(config, names) == "hf"
    quantised = ModelConfig.from_dict({**hf_config(hf_moe), "quantization": {"group_size": 64, "bits": 4}})
    mlx_names = ["language_model.model.embed_tokens.weight", "language_model.model.embed_tokens.scales"]
    try:
        assert detect_format(quantised, mlx_names) == "mlx"
    except CheckpointError as e:  # until the MLX plug-in lands, the error must say what the checkpoint looks like
        assert "'mlx' quantised checkpoint" in str(e)


def test_progress_bar_and_summary_log(hf_dense, tmp_path, capsys, caplog):
    write_checkpoint(tmp_path, hf_config(hf_dense), fused_tensors(hf_dense))
    with caplog.at_level("INFO", logger="deltaserve.weights"):
        load_checkpoint(tmp_path, progress=True)
    assert "loading" in capsys.readouterr().err
    assert "format hf" in caplog.text and "set aside: visual" in caplog.text


# ---- memory ----------------------------------------------------------------------------------------------------------

def write_random_bf16(path: Path, text: dict, shards: int) -> int:
    """A random bf16 qwen3_5_moe checkpoint (names from our meta model + the HF prefix); returns its bytes."""
    from deltaserve.model import Qwen3_5ForCausalLM

    config = {"model_type": "qwen3_5_moe", "text_config": text, "tie_word_embeddings": False}
    with torch.device("meta"):
        meta = Qwen3_5ForCausalLM(ModelConfig.from_dict(config))
    g = torch.Generator().manual_seed(0)
    tensors = {
        (n if n == "lm_head.weight" else LM + n): (torch.randn(p.shape, generator=g) * 0.02).bfloat16()
        for n, p in meta.named_parameters()
    }
    write_checkpoint(path, config, tensors, shards)
    return sum(t.numel() * 2 for t in tensors.values())


def test_peak_rss_of_a_mid_size_bf16_to_fp32_load(tmp_path):
    """Loading ~230 MB of bf16 into fp32 grows the peak RSS by at most 1.3x the fp32 parameter bytes."""
    text = dict(
        vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
        linear_value_head_dim=64, num_experts=12, num_experts_per_tok=2, moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    )  # fmt: skip
    size = write_random_bf16(tmp_path, text, shards=2)
    assert 180e6 < size < 300e6
    r = rss_probe.measure("load", tmp_path, "float32")
    assert r["param_bytes"] == 2 * size
    growth = r["peak"] - r["before"]
    assert growth <= 1.3 * r["param_bytes"], f"peak RSS grew {growth / 2**20:.0f} MiB for {r['param_bytes'] / 2**20:.0f} MiB of params"


# ---- quantised formats through the same loader ------------------------------------------------------------------------


def test_mlx_checkpoint_from_mlx_lm_convert_matches_mlx_lm(hf_moe, tmp_path):
    """The MLX plug-in is picked up by the registry: mlx_lm.convert's 4-bit output loads and gives mlx_lm's logits."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm import convert, load

    write_checkpoint(tmp_path / "hf", hf_config(hf_moe), fused_tensors(hf_moe))  # mlx_lm reads the fused layout
    convert(str(tmp_path / "hf"), str(tmp_path / "mlx"), quantize=True, q_bits=4, q_group_size=32)
    ckpt = load_checkpoint(tmp_path / "mlx", progress=False)
    assert ckpt.format == "mlx" and detect_format(ckpt.config, list(_names(tmp_path / "mlx"))) == "mlx"
    assert any(p.dtype == torch.uint32 for p in ckpt.model.parameters())  # loaded packed, not dequantised
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    mlx_model, _ = load(str(tmp_path / "mlx"))
    ref = torch.from_numpy(np.array(mlx_model(mx.array([ids])).astype(mx.float32)))[0]
    err = (all_logits(ckpt.model, ids) - ref).abs().max().item()
    assert err <= 1e-5 * ref.abs().max().item(), err


def _names(path: Path) -> list[str]:
    from deltaserve.weights import SafetensorsCheckpoint

    return SafetensorsCheckpoint(path).names


def fp8_release_tensors(tensors: dict[str, torch.Tensor], block: int) -> tuple[dict, dict]:
    """(FP8 tensors in the release layout: per-expert, fp8 weights + weight_scale_inv; the same weights dequantised).

    Converted like the releases: every 2-D projection of the language model except in_proj_a/b, the routers,
    shared_expert_gate, embeddings and lm_head."""
    from deltaserve.kernels.quant import fp8_block_dequantize
    from deltaserve.kernels.quant.fp8 import fp8_block_quantize

    keep = ("in_proj_a.", "in_proj_b.", "mlp.gate.", "shared_expert_gate.", "embed_tokens.", "lm_head.")
    fp8, dense = {}, {}
    for name, t in per_expert_tensors(tensors).items():
        if t.dim() == 2 and name.endswith("proj.weight") and name.startswith(LM) and not any(k in name for k in keep):
            w8, scale = fp8_block_quantize(t, (block, block))
            fp8[name], fp8[name + "_scale_inv"] = w8, scale
            dense[name] = fp8_block_dequantize(w8, scale, (block, block), torch.float32)
        else:
            fp8[name] = dense[name] = t
    return fp8, dense


def test_fp8_release_layout_equals_its_dequantised_dense_checkpoint(hf_moe, tmp_path):
    """The FP8 plug-in through the loader: same logits as the bf16/fp32 checkpoint holding the dequantised weights."""
    fp8, dense = fp8_release_tensors(fused_tensors(hf_moe), block=32)
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}
    write_checkpoint(tmp_path / "fp8", {**hf_config(hf_moe), "quantization_config": qc}, fp8, shards=2)
    write_checkpoint(tmp_path / "dense", hf_config(hf_moe), dense, shards=2)
    q = load_checkpoint(tmp_path / "fp8", dtype=torch.float32, progress=False)
    d = load_checkpoint(tmp_path / "dense", progress=False)
    assert (q.format, d.format) == ("fp8", "hf")
    assert sum(p.dtype == torch.uint8 for p in q.model.parameters()) > 0  # FP8 bits kept, not dequantised at load
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = all_logits(d.model, ids)
    err = (all_logits(q.model, ids) - ref).abs().max().item()
    assert err <= 1e-5 * ref.abs().max().item(), err


# ---- device placement (run on the GPU machine: pytest -m gpu) ----------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_onto_cuda_equals_cpu_load(tmp_path, dtype):
    """device="cuda": every parameter lands on the GPU with the same bits as a CPU load (per-expert, sharded)."""
    text = dict(
        vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    )  # fmt: skip
    write_random_bf16(tmp_path / "fused", text, shards=2)
    config = json.loads((tmp_path / "fused" / "config.json").read_text())
    from safetensors.torch import load_file

    tensors = {k: v for f in sorted((tmp_path / "fused").glob("*.safetensors")) for k, v in load_file(f).items()}
    write_checkpoint(tmp_path / "per", config, per_expert_tensors(tensors), shards=3)
    cpu = load_checkpoint(tmp_path / "per", dtype=dtype, progress=False).model.state_dict()
    gpu = load_checkpoint(tmp_path / "per", device="cuda", dtype=dtype, progress=False).model.state_dict()
    assert cpu.keys() == gpu.keys()
    for name, t in gpu.items():
        assert t.device.type == "cuda" and t.dtype == cpu[name].dtype, name
        assert torch.equal(t.cpu(), cpu[name]), name


# ---- synthetic checkpoints in the published layout (deltaserve.synthetic) ---------------------------------------------

HF_CLASSES = {
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_next": "Qwen3NextForCausalLM",
}


@pytest.mark.parametrize(
    "preset,layout", [("tiny-moe", "fused"), ("tiny-moe", "per_expert"), ("tiny-dense", None), ("tiny-next", None)]
)
def test_synthetic_checkpoint_matches_transformers(tmp_path, preset, layout):
    """make_checkpoint's published layout (MTP, vision, sharded): load_checkpoint == transformers.from_pretrained."""
    import transformers
    from deltaserve.synthetic import make_checkpoint

    path = make_checkpoint(tmp_path, preset, seed=3, dtype="fp32", expert_layout=layout, progress=False)
    ckpt = load_checkpoint(path, progress=False, mtp=False)  # the MTP head's own loading: tests/test_mtp_weights.py
    names = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    for group, prefix in (("mtp", "mtp."), ("visual", "model.visual.")):
        assert sorted(ckpt.set_aside.get(group, [])) == sorted(n for n in names if n.startswith(prefix))
    assert ckpt.num_tensors + sum(map(len, ckpt.set_aside.values())) == len(names)  # every tensor accounted for
    hf_cls = getattr(transformers, HF_CLASSES[ckpt.config.model_type])
    hf = hf_cls.from_pretrained(path, dtype=torch.float32).eval()
    # The loader's contract, exactly: every parameter holds the bits transformers loaded for it.
    ref = hf.state_dict()
    prefix = "model." if ckpt.config.model_type == "qwen3_next" else LM
    fused_in_hf = ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight")
    for name, t in ckpt.model.state_dict().items():
        if prefix == "model." and name.endswith(fused_in_hf):
            continue  # qwen3_next: transformers keeps the fused tensors (split checked in the qwen3_next test above)
        assert torch.equal(t, ref[name if name == "lm_head.weight" else prefix + name]), name
    # Logits: the synthetic init has published-range decays (A_log up to ~2.4), with which BOTH fp32 models sit about
    # 4e-5 (relative) from transformers run in fp64 on 40 tokens; 1e-4 is the fp32 noise floor here, where the
    # make_hf_model checkpoints above (milder decays) hold 1e-5.
    assert_same_logits(hf, ckpt.model, rel=1e-4)
