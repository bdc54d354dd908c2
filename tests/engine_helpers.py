"""Shared helpers for engine/API tests: a tiny random model, a byte-level tokenizer, a scripted fake model."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from deltaserve.model import ModelConfig, Qwen3_5ForCausalLM

import model_helpers

# The reference path on 2 shared cores is many times faster single-threaded (thread hand-offs dominate tiny ops).
torch.set_num_threads(1)

# The model tests' tiny shapes, with this module's byte tokenizer's <|im_end|> as eos and a context limit.
TINY_TEXT = dict(model_helpers.TINY_TEXT, max_position_embeddings=4096, eos_token_id=258)
TINY_MOE = model_helpers.TINY_MOE
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]  # ids 256..260

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)


def tiny_config(moe: bool = True, **overrides) -> ModelConfig:
    text = dict(TINY_TEXT, **(TINY_MOE if moe else {"intermediate_size": 96}), **overrides)
    return ModelConfig.from_dict({"model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text})


def tiny_model(moe: bool = True, seed: int = 0, **overrides) -> Qwen3_5ForCausalLM:
    """Random fp32 model; embeddings/head at std 0.5 so greedy tokens have real margins (no near-ties)."""
    model = Qwen3_5ForCausalLM(tiny_config(moe, **overrides))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.5 if ("embed_tokens" in name or "lm_head" in name or "mlp.gate." in name) else 0.2
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def byte_tokenizer() -> Tokenizer:
    """Byte-level BPE without merges: one token per byte (ids 0..255), so multi-byte characters span tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _byte_of(c))
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def _byte_of(char: str) -> int:
    """Inverse of the GPT-2 byte -> printable character map used by ByteLevel."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if ord(char) in printable:
        return ord(char)
    extra = [b for b in range(256) if b not in printable]
    return extra[ord(char) - 256]


def random_prompt(n: int, seed: int = 0, vocab: int = 256) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class ScriptedModel(torch.nn.Module):
    """Engine-facing fake: after a prompt of `prompt_len` tokens, token at output index j is script[j].

    Implements only what the engine uses (config, parameters(), make_cache, forward(batch, cache) -> logits)."""

    def __init__(self, script: list[int], prompt_len: int, vocab: int = 300):
        super().__init__()
        self.script, self.prompt_len = script, prompt_len
        # no layers: a cache of no bytes (cache_spec), whose prefix-cache snapshots are nothing to copy
        self.config = SimpleNamespace(vocab_size=vocab, max_position_embeddings=4096, eos_token_ids=(),
                                      full_attention_layers=[], linear_attention_layers=[], head_dim=1,
                                      num_key_value_heads=1, conv_dim=1, linear_conv_kernel_dim=1,
                                      linear_num_value_heads=1, linear_key_head_dim=1, linear_value_head_dim=1)
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    def make_cache(self, num_blocks, block_size, num_state_slots, dtype=None, device=None, kv_dtype=None,
                   num_snapshots=0):
        return SimpleNamespace(block_size=block_size, num_blocks=num_blocks, num_state_slots=num_state_slots,
                               save_state=lambda slot, snap: None, load_state=lambda snap, slot: None)

    def forward(self, batch, cache) -> torch.Tensor:
        cache_index = []  # cache index of every new token, flat
        for ctx, n in zip(batch.context_lens_cpu, batch.seq_lens_cpu):
            cache_index.extend(range(ctx, ctx + n))
        picked = [cache_index[i] for i in batch.logits_indices.tolist()]
        logits = torch.zeros(len(picked), self.config.vocab_size)
        for row, idx in enumerate(picked):
            j = idx + 1 - self.prompt_len
            logits[row, self.script[j] if 0 <= j < len(self.script) else 0] = 10.0
        return logits


def drain(engine, prompts, params, on_step=None) -> list[list[int]]:
    """Add every prompt, step the engine until all finish (on_step(engine) after each step), check every block
    was given back, and return each request's output token ids in prompt order."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        if on_step is not None:
            on_step(engine)
    assert engine.scheduler.blocks.num_free == engine.num_blocks  # everything given back
    return [done[i] for i in ids]
