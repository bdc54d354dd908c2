"""Shared helpers for model-level tests: tiny transformers models and a plain greedy loop over the forward contract."""

from __future__ import annotations

import torch

from deltaserve.model import ForwardBatch, ModelConfig, Qwen3_5ForCausalLM

BLOCK = 16

TINY_TEXT = dict(
    vocab_size=300,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_parameters=dict(
        rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[2, 1, 1], mrope_interleaved=True
    ),
    eos_token_id=1,
)
TINY_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
TINY_VISION = dict(
    depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=4,
    temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
)


def make_hf_model(moe: bool, seed: int = 0, tie: bool = False, head_std: float = 0.5, **text_overrides):
    """A random tiny transformers Qwen3.5 (MoE or dense) in fp32 with non-trivial norms and gates.

    head_std: std of the embedding and lm_head weights, i.e. how peaked the logits are (larger = wider top-1
    margins, for checks that compare bf16 against fp32)."""
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeConfig,
        Qwen3_5MoeForConditionalGeneration,
    )

    torch.manual_seed(seed)
    text = {**TINY_TEXT, **(TINY_MOE if moe else {"intermediate_size": 96}), **text_overrides}
    text["tie_word_embeddings"] = tie
    vision = dict(TINY_VISION, out_hidden_size=text["hidden_size"])
    if moe:
        cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie)
        model = Qwen3_5MoeForConditionalGeneration(cfg)
    else:
        cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=tie)
        model = Qwen3_5ForConditionalGeneration(cfg)
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "A_log" in name or "dt_bias" in name:
                p.add_(torch.randn_like(p) * 0.2)  # zero-centred norms would otherwise be exact identities
            elif "mlp.gate.weight" in name:
                p.normal_(0, 0.5)  # routers: spread the expert choices
            elif "embed_tokens" in name or "lm_head" in name:
                p.normal_(0, head_std)  # logits with real margins so greedy tokens are not near-ties
    return model


def ours_from_state_dict(hf_model) -> Qwen3_5ForCausalLM:
    """Our model from a transformers model's weights (prefix stripped), in fp32, without a file in between."""
    config = ModelConfig.from_dict(hf_model.config.to_dict())
    model = Qwen3_5ForCausalLM(config)
    prefix = "model.language_model."
    sd = {k[len(prefix) :]: v for k, v in hf_model.state_dict().items() if k.startswith(prefix)}
    if not config.tie_word_embeddings:
        sd["lm_head.weight"] = hf_model.state_dict()["lm_head.weight"]
    model.load_state_dict(sd, strict=True)
    return model.eval()


def ours_from_checkpoint(hf_model, directory) -> Qwen3_5ForCausalLM:
    """Write the transformers model as a checkpoint in the published fused-expert layout (its in-memory names are
    the published names: experts.gate_up_proj [E, 2I, H] etc.), then load it with deltaserve's loader."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    from deltaserve.weights.loader import load_checkpoint

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    if hf_model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    assert any(k.endswith("experts.gate_up_proj") for k in tensors) == hasattr(hf_model.config.text_config, "num_experts")
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_model.config.to_dict()))
    return load_checkpoint(directory, dtype=torch.float32, progress=False).model


class Session:
    """One model + cache; sequences get consecutive block ranges and their own state slot."""

    def __init__(self, model, max_len=512, max_seqs=8, kv_dtype=None):
        self.model = model
        per_seq = -(-max_len // BLOCK)
        self.per_seq = per_seq
        self.cache = model.make_cache(per_seq * max_seqs, BLOCK, max_seqs, torch.float32, kv_dtype=kv_dtype)

    def table(self, seq: int) -> list[int]:
        return list(range(seq * self.per_seq, (seq + 1) * self.per_seq))

    @torch.no_grad()
    def step(self, chunks: dict[int, list[int]], ctx: dict[int, int], logits="last"):
        seqs = sorted(chunks)
        fb = ForwardBatch.build(
            [chunks[s] for s in seqs], [ctx[s] for s in seqs], [self.table(s) for s in seqs], seqs, BLOCK, logits=logits
        )
        out = self.model(fb, self.cache)
        for s in seqs:
            ctx[s] += len(chunks[s])
        return out


@torch.no_grad()
def bf16_exact_moe_checkpoint(directory) -> Qwen3_5ForCausalLM:
    """A transformers-initialised tiny MoE model (32-token vocabulary) whose weights are bf16-exact, as a bf16
    release holds (A_log stays fp32, as in the releases), written to `directory` (fused layout); returns our fp32
    model loaded from it. The GPU tests load the same directory in bf16 on the fast path."""
    hf = make_hf_model(True, seed=0, vocab_size=32)
    for name, p in hf.named_parameters():
        if not name.endswith("A_log"):
            p.copy_(p.bfloat16().float())
    return ours_from_checkpoint(hf, directory)


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, prefill_chunk: int | None = None, kv_dtype=None
           ) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation of n tokens; returns the tokens and the prompt's all-position logits."""
    sess = Session(model, kv_dtype=kv_dtype)
    ctx = {0: 0}
    step = prefill_chunk or len(prompt)
    prompt_logits = []
    for i in range(0, len(prompt), step):
        prompt_logits.append(sess.step({0: prompt[i : i + step]}, ctx, logits="all"))
    logits = torch.cat(prompt_logits)
    out = []
    nxt = int(logits[-1].argmax())
    for _ in range(n):
        out.append(nxt)
        nxt = int(sess.step({0: [nxt]}, ctx)[0].argmax())
    return out, logits


def prompt(n: int, seed: int = 0, vocab: int = 300) -> list[int]:
    """n random token ids in [2, vocab), from their own seeded generator."""
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return ((a - b).abs().max() / b.abs().max()).item()
