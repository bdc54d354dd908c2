"""Helpers for the quantisation tests (no tests here): tiny HF checkpoints in the published layout, an FP8 release
layout writer, and an mlx_lm oracle (logits and greedy decode through mlx_lm's own cache)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from model_helpers import greedy, make_hf_model

VOCAB = 300  # model_helpers.TINY_TEXT


def write_tokenizer(out: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary ("t0" .. "t299"), enough for mlx_lm.load / convert."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1", unk_token="t0").save_pretrained(str(out))


def write_hf_checkpoint(out: Path, moe: bool, tie: bool = False, seed: int = 0, **text) -> Path:
    """A random tiny transformers Qwen3.5 (fp32) saved in the published tensor layout (fused experts
    `experts.gate_up_proj` / `experts.down_proj`, which mlx_lm's sanitize expects), with tokenizer files."""
    model = make_hf_model(moe, seed=seed, tie=tie, **text)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if tie:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    cfg["dtype"] = "float32"  # as model.save_pretrained (and every published config) records it
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(out)
    return out


def fp8_release(hf_dir: Path, out: Path, block: int = 128, scale_dtype=torch.float32) -> Path:
    """The FP8 release layout of an HF checkpoint: per-expert tensors, float8_e4m3fn weights + weight_scale_inv for
    every language-model projection except in_proj_a/b, routers, shared_expert_gate, embeddings and lm_head."""
    from safetensors.torch import load_file

    from deltaserve.kernels.quant import fp8_block_quantize

    keep = ("in_proj_a.", "in_proj_b.", "mlp.gate.", "shared_expert_gate.", "embed_tokens.", "lm_head.", "visual.")
    src = load_file(str(hf_dir / "model.safetensors"))
    cfg = json.loads((hf_dir / "config.json").read_text())
    tensors = {}

    def put(name: str, w: torch.Tensor) -> None:
        if any(k in name for k in keep) or w.dim() != 2 or not name.endswith(".weight"):
            tensors[name] = w.bfloat16() if w.dtype == torch.float32 and "A_log" not in name else w
            return
        tensors[name], tensors[name + "_scale_inv"] = fp8_block_quantize(w, (block, block), scale_dtype)

    for name, t in src.items():
        if name.endswith("experts.gate_up_proj"):
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                put(name.replace("gate_up_proj", f"{e}.gate_proj.weight"), t[e, :inter])
                put(name.replace("gate_up_proj", f"{e}.up_proj.weight"), t[e, inter:])
        elif name.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                put(name.replace("down_proj", f"{e}.down_proj.weight"), t[e])
        else:
            put(name, t)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    cfg["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [block, block],
        "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate", "in_proj_a",
                                   "in_proj_b", "model.visual"],
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(out)
    return out


# ---- mlx_lm oracle ---------------------------------------------------------------------------------------------


def mlx_model_fp32(path: Path):
    """mlx_lm's model for an MLX checkpoint with every float parameter widened to fp32 (exact for bf16 scales), so
    both engines dequantise to the same fp32 weights and compute in fp32."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(path))
    model.update(tree_map(lambda a: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a,
                          model.parameters()))  # fmt: skip
    return model


def mlx_logits(model, ids: list[int]) -> torch.Tensor:
    import mlx.core as mx

    return torch.from_numpy(np.array(model(mx.array([ids]))[0].astype(mx.float32)))


def mlx_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation with mlx_lm's cache (prefill once, then one token per step)."""
    import mlx.core as mx

    cache = model.make_cache()
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(n):
        nxt = int(mx.argmax(logits[0, -1]).item())
        out.append(nxt)
        logits = model(mx.array([[nxt]]), cache=cache)
    return out


def ours_logits(model, ids: list[int]) -> torch.Tensor:
    return greedy(model, ids, 0)[1]


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    err = (got - want).abs().max().item()
    assert err <= rel * want.abs().max().item(), f"max |diff| {err:.3g} vs max|logit| {want.abs().max():.3g}"


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose dtype, shape or bytes differ (uint32 compared bit for bit)."""
    bad = sorted(set(a) ^ set(b))
    for k in set(a) & set(b):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            bad.append(k)
        elif x.dtype == torch.uint32:
            if not torch.equal(x.view(torch.int32), y.view(torch.int32)):
                bad.append(k)
        elif not torch.equal(x, y):
            bad.append(k)
    return bad
