"""GGUF metadata of a Qwen3.5/3.6 export: the `qwen35moe` / `qwen35` hyper-parameter keys llama.cpp reads and the
gpt2-style BPE tokenizer keys, from our config and the checkpoint's tokenizer files.

Keys (llama.cpp src/llama-arch.cpp, read by llama-model.cpp and models/qwen35*.cpp): block_count (text layers only,
no MTP block), context_length, embedding_length, feed_forward_length (dense), attention.head_count /
head_count_kv / key_length / value_length / layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count (the
rotated dims: head_dim * partial_rotary_factor), rope.dimension_sections (interleaved MRoPE [11, 11, 10, 0]),
expert_count / expert_used_count / expert_feed_forward_length / expert_shared_feed_forward_length, ssm.conv_kernel /
state_size (dk) / group_count (Hk) / time_step_rank (Hv) / inner_size (Hv * dv), attention.recurrent_layers (one
bool per layer: DeltaNet or not) and full_attention_interval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf

from ..model.config import ModelConfig
from .layout import ExportError, arch_of

# tokenizer.json pre-tokeniser split regex -> llama.cpp's name for it (tokenizer.ggml.pre). Qwen3.5 differs from
# Qwen2/3 in that letter runs include combining marks (\p{M}).
PRE_TOKENIZERS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen35",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}  # fmt: skip


def write_arch_metadata(w: gguf.GGUFWriter, config: ModelConfig) -> None:
    arch = arch_of(config)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    if not config.is_moe:
        w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(config.rope_theta)
    w.add_rope_dimension_count(config.rotary_dim)
    # llama.cpp's qwen35 loaders require 4 sections; text-only input makes the three axes equal anyway.
    sections = list(config.mrope_section or (11, 11, 10))
    w.add_rope_dimension_sections((sections + [0, 0, 0, 0])[:4])
    if config.is_moe:
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        if config.shared_expert_intermediate_size:
            w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    w.add_ssm_conv_kernel(config.linear_conv_kernel_dim)
    w.add_ssm_state_size(config.linear_key_head_dim)
    w.add_ssm_group_count(config.linear_num_key_heads)
    w.add_ssm_time_step_rank(config.linear_num_value_heads)
    w.add_ssm_inner_size(config.value_dim)
    w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in config.layer_types])
    w.add_full_attention_interval(config.raw.get("full_attention_interval") or _interval(config))


def _interval(config: ModelConfig) -> int:
    full = config.full_attention_layers
    return full[0] + 1 if full else config.num_hidden_layers


# ---- tokenizer -----------------------------------------------------------------------------------------------------
@dataclass
class Vocab:
    tokens: list[str]  # one per embedding row; rows past the tokenizer are "[PAD{i}]"
    types: list[int]  # gguf.TokenType values
    merges: list[str]  # "left right"
    pre: str
    special: dict[str, int]  # bos / eos / pad -> id
    add_bos: bool
    chat_template: str | None


def read_vocab(model_dir: str | Path, config: ModelConfig) -> Vocab:
    """The gpt2-style vocabulary llama.cpp needs, from tokenizer.json (+ tokenizer_config.json) of model_dir."""
    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ExportError(f"{model_dir}: no tokenizer.json (the GGUF file needs the tokenizer)")
    tok = json.loads(path.read_text())
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ExportError(f"{path}: expected a byte-level BPE model with a vocab, found type {model.get('type')!r}")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    by_id.update({i: a["content"] for i, a in added.items()})
    if max(by_id) >= config.vocab_size:
        raise ExportError(f"{path}: token id {max(by_id)} is outside the model's vocab_size {config.vocab_size}")
    tokens, types = [], []
    for i in range(config.vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            text = by_id[i]
            control = added[i].get("special") or (text.startswith("<|") and text.endswith("|>"))
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    tc = _read_json(model_dir / "tokenizer_config.json")
    return Vocab(
        tokens, [int(t) for t in types], _merges(model.get("merges") or [], path), _pre_tokenizer(tok, path),
        _special_ids(tc, config, {t: i for i, t in by_id.items()}), bool(tc.get("add_bos_token", False)),
        _chat_template(model_dir, tc),
    )  # fmt: skip


def write_vocab(w: gguf.GGUFWriter, vocab: Vocab) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    for kind, tid in vocab.special.items():
        getattr(w, f"add_{kind}_token_id")(tid)
    w.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _merges(merges: list, path: Path) -> list[str]:
    out = []
    for m in merges:
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m):
            if " " in m[0] or " " in m[1]:  # llama.cpp splits a merge at its space
                raise ExportError(f"{path}: merge {m!r} contains a space; not representable in GGUF merges")
            out.append(f"{m[0]} {m[1]}")
        else:
            raise ExportError(f"{path}: unreadable merge entry {m!r}")
    return out


def _pre_tokenizer(tok: dict, path: Path) -> str:
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for step in steps:
        regex = (step.get("pattern") or {}).get("Regex") if step.get("type") == "Split" else None
        if regex is not None:
            if regex not in PRE_TOKENIZERS:
                raise ExportError(f"{path}: pre-tokeniser split regex {regex!r} matches no llama.cpp pre-tokeniser "
                                  f"this exporter knows ({', '.join(PRE_TOKENIZERS.values())})")
            return PRE_TOKENIZERS[regex]
    raise ExportError(f"{path}: no Split pre-tokeniser (byte-level BPE with the Qwen split regex expected)")


def _special_ids(tc: dict, config: ModelConfig, ids: dict[str, int]) -> dict[str, int]:
    """bos / eos / pad: tokenizer_config.json's tokens first (eos <|im_end|> for chat), then config.json's ids."""
    out = {}
    fallback = {"bos": config.bos_token_id, "eos": (config.eos_token_ids or (None,))[0], "pad": config.pad_token_id}
    for kind in ("bos", "eos", "pad"):
        text = tc.get(f"{kind}_token")
        text = text.get("content") if isinstance(text, dict) else text
        tid = ids.get(text) if text else None
        tid = tid if tid is not None else fallback[kind]
        if tid is not None:
            out[kind] = int(tid)
    return out


def _chat_template(model_dir: Path, tc: dict) -> str | None:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tc.get("chat_template")
    return template if isinstance(template, str) else None
