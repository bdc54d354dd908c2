"""The MTP head's tensors in every checkpoint format: HF (fused and per-expert experts), the FP8 release layout
(per-expert FP8 experts), and MLX affine as `deltaserve quantize` and the synthetic q4 writer keep it; a checkpoint
without the head loads and says that drafting is unavailable when asked; `deltaserve info` lists it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from deltaserve.model import ForwardBatch
from deltaserve.synthetic import make_checkpoint
from deltaserve.synthetic.quantized import write_quantized_synthetic
from deltaserve.weights import CheckpointError, load_checkpoint
from deltaserve.weights.inspect import checkpoint_sizes, describe_checkpoint
from deltaserve.weights.quantizer import quantize_checkpoint
from test_quant_support import fp8_release

BLOCK = 16


def tensors_of(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("model*.safetensors")):
        out.update(load_file(str(f)))
    return out


def rewrite(src, dst, tensors: dict[str, torch.Tensor]):
    """src's config and tokenizer files with `tensors` as one model.safetensors."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix in (".json", ".txt", ".jinja") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("bf16") / "moe", "tiny-moe", seed=4, progress=False)


@torch.no_grad()
def drafts(model, reference, n: int = 21) -> tuple[torch.Tensor, torch.Tensor]:
    """(the MTP's draft logits for every row of an n-token prompt's first pass, its y rows) of `model`'s head, fed
    the hidden states and next tokens of `reference` (so only the heads differ; fp32 models)."""
    ids = torch.randint(2, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    batch = ForwardBatch.build([ids], [0], [[0, 1]], [0], BLOCK, logits="all")
    logits, h = reference.forward_with_hidden(batch, reference.make_cache(2, BLOCK, 1, torch.float32))
    nxt = ids[1:] + [int(logits[-1].argmax())]
    cache = model.make_cache(2, BLOCK, 1, torch.float32, mtp=True)
    return model.draft(ForwardBatch.build([nxt], [0], [[0, 1]], [0], BLOCK, logits="all"), cache, h)


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_hf_fused_and_per_expert_load_the_same_head(bf16, tmp_path):
    per = make_checkpoint(tmp_path / "per", "tiny-moe", seed=4, expert_layout="per_expert", progress=False)
    assert any(k.startswith("mtp.layers.0.mlp.experts.3.up_proj") for k in tensors_of(per))
    a, b = load_checkpoint(bf16, progress=False, mtp=True), load_checkpoint(per, progress=False, mtp=None)
    assert "mtp" not in a.set_aside and "mtp head: 1 layer(s) loaded" in a.summary()
    files = tensors_of(bf16)
    mtp_a = {k: v for k, v in a.model.state_dict().items() if k.startswith("mtp.")}
    assert mtp_a.keys() == {k for k in files if k.startswith("mtp.")}  # our names are the published ones
    for name, t in mtp_a.items():
        assert torch.equal(t, files[name]), name  # bf16 file -> bf16 parameter, unchanged
        assert torch.equal(t, b.model.state_dict()[name]), name
    off = load_checkpoint(bf16, progress=False)  # the default: set aside (loaded to draft only)
    assert off.model.mtp is None and sorted(off.set_aside["mtp"]) == sorted(mtp_a)


def test_fp8_release_loads_the_head_with_fp8_experts(bf16, tmp_path):
    dense = load_checkpoint(bf16, dtype=torch.float32, progress=False, mtp=True).model
    single = rewrite(bf16, tmp_path / "single", {k: v.float() if v.dtype == torch.bfloat16 else v
                                                  for k, v in tensors_of(bf16).items()})
    path = fp8_release(single, tmp_path / "fp8", block=32)
    names = tensors_of(path)
    assert names["mtp.layers.0.mlp.experts.0.gate_proj.weight"].dtype == torch.float8_e4m3fn
    assert "mtp.layers.0.mlp.experts.0.gate_proj.weight_scale_inv" in names
    fp8 = load_checkpoint(path, dtype=torch.float32, progress=False, mtp=True)
    head = fp8.model.mtp
    assert fp8.format == "fp8" and type(head.fc).__name__ == "Fp8Linear"
    assert type(head.layers[0].mlp.experts.gate_proj).__name__ == "Fp8Stacked"
    assert type(head.layers[0].mlp.gate).__name__ == "DenseLinear"  # routers stay bf16 in the releases
    (got_logits, got_y), (want_logits, want_y) = drafts(fp8.model, dense), drafts(dense, dense)
    # e4m3 weights (blocks of 32): ~7% / ~10% here, where a mis-mapped head (norms, fc halves, experts) is ~100%
    assert rel(got_y, want_y) < 0.15 and rel(got_logits, want_logits) < 0.15


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_keeps_the_head_in_mlx_layout(bf16, tmp_path, bits):
    q = quantize_checkpoint(bf16, tmp_path / f"q{bits}", bits, 64, progress=False)
    files = tensors_of(q)
    entry = json.loads((q / "config.json").read_text())["quantization"]
    assert entry["mtp.layers.0.mlp.gate"] == entry["mtp.layers.0.mlp.shared_expert_gate"] == {"group_size": 64,
                                                                                               "bits": 8}
    assert "mtp.layers.0.mlp.switch_mlp.gate_proj.scales" in files and "mtp.fc.scales" in files
    src = tensors_of(bf16)
    for name in ("mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_norm.weight"):
        assert torch.equal(files[name], src[name] + 1), name  # +1 baked in, as the body's zero-centred norms
    loaded = load_checkpoint(q, dtype=torch.float32, progress=False, mtp=True)
    assert loaded.format == "mlx" and loaded.model.mtp.norm.offset == 0.0
    assert type(loaded.model.mtp.fc).__name__ == "AffineLinear"
    dense = load_checkpoint(bf16, dtype=torch.float32, progress=False, mtp=True).model
    (got_logits, got_y), (want_logits, want_y) = drafts(loaded.model, dense), drafts(dense, dense)
    bound = 0.03 if bits == 8 else 0.4  # measured 1.2% / 1.4% (q8), 24% / 26% (q4: routing flips); mis-mapped ~100%
    assert rel(got_y, want_y) < bound and rel(got_logits, want_logits) < bound
    again = quantize_checkpoint(q, tmp_path / f"again{bits}", bits, 64, progress=False)  # an MLX input keeps it too
    assert "mtp.fc.scales" in tensors_of(again)


def test_synthetic_q4_writes_the_head_mlx_lm_still_loads(tmp_path):
    path = write_quantized_synthetic(tmp_path / "q4", "tiny-moe", "q4", seed=3, progress=False)
    assert "mtp.layers.0.mlp.switch_mlp.gate_proj.scales" in tensors_of(path)
    assert load_checkpoint(path, progress=False, mtp=True).model.mtp is not None
    mlx_lm = pytest.importorskip("mlx_lm")
    mlx_lm.load(str(path))  # mlx_lm drops `mtp.` keys when it loads a qwen3_5* checkpoint


def test_without_a_head_serves_and_refuses_drafting_clearly(bf16, tmp_path):
    body = {k: v for k, v in tensors_of(bf16).items() if not k.startswith("mtp.")}
    path = rewrite(bf16, tmp_path / "nohead", body)
    loaded = load_checkpoint(path, progress=False, mtp=None)  # the head when there is one: none here
    assert loaded.model.mtp is None and "mtp" not in loaded.set_aside
    with pytest.raises(CheckpointError, match="no MTP head in this checkpoint.*unavailable.*mlx-community"):
        load_checkpoint(path, progress=False, mtp=True)
    text = describe_checkpoint(path)
    assert "MTP head: none in this checkpoint" in text and "mtp head (drafting)" not in text


def test_a_partial_head_names_what_is_missing(bf16, tmp_path):
    tensors = tensors_of(bf16)
    del tensors["mtp.layers.0.self_attn.k_norm.weight"]
    path = rewrite(bf16, tmp_path / "partial", tensors)
    with pytest.raises(CheckpointError, match="missing tensor mtp.layers.0.self_attn.k_norm.weight"):
        load_checkpoint(path, progress=False, mtp=None)
    assert load_checkpoint(path, progress=False).model.mtp is None  # set aside: the body still serves


def test_info_lists_the_head(bf16):
    s = checkpoint_sizes(bf16)
    assert s.mtp_layers == 1 and s.rows["mtp head (drafting)"][0] > 0
    nbytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert s.resident_bytes == nbytes(load_checkpoint(bf16, progress=False).model)  # the default: no head
    drafting = load_checkpoint(bf16, progress=False, mtp=True).model
    assert s.resident_bytes + s.rows["mtp head (drafting)"][1] == nbytes(drafting)
    text = describe_checkpoint(bf16)
    assert "MTP head: 1 layer(s) (speculative decoding" in text and "mtp head (drafting)" in text
