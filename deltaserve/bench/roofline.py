"""Bytes a decode step must move, for the % of bandwidth roofline (bench/README.md: the method).

bytes(step) = weights read in their stored format (every non-expert matrix, the router, the k picked experts of
each token — the distinct ones across the batch —, the shared expert, lm_head, one embedding row per token)
+ KV read for the context of every stream + DeltaNet conv/recurrent state read and written for every stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.config import ModelConfig

# Measured device-to-device copy bandwidth (bytes read + written) of each GPU we have timed on, by a substring of
# torch.cuda.get_device_name(): the roofline's ceiling. H200: 4 GiB bf16 buffer, shared/GPU_NOTES.md. H100 80GB HBM3:
# a 2 GiB uint8 copy, median of 20 after 3 warm-ups, 1.431 ms (2026-12-05, lab/NOTES.md). A GPU not listed gets
# no % of roofline (a datasheet figure is not a measured ceiling).
COPY_BYTES_PER_S = {"H200": 4.29e12, "H100 80GB HBM3": 3.00e12}


def copy_ceiling(gpu: str) -> float | None:
    """The measured copy bandwidth of the named GPU (bytes/s), or None where we have not measured one."""
    hits = [bw for key, bw in COPY_BYTES_PER_S.items() if key in gpu]
    return hits[0] if len(hits) == 1 else None


@dataclass(frozen=True)
class WeightFormat:
    """Bits per stored weight for the bulk matrices and for the 8-bit gates (routers, shared-expert gates)."""

    name: str
    matrix_bits: float
    gate_bits: float

    @classmethod
    def of(cls, quant: str | None) -> "WeightFormat":
        if quant in (None, "bf16", "none"):
            return cls("bf16", 16.0, 16.0)
        if quant in ("q4", "q4g64"):
            return cls("q4g64", 4 + 32 / 64, 8 + 32 / 64)
        if quant in ("q8", "q8g64"):
            return cls("q8g64", 8 + 32 / 64, 8 + 32 / 64)
        raise ValueError(f"unknown quant {quant!r} (expected bf16, q4 or q8)")


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """E[#distinct experts] when each of `tokens` tokens picks top_k of num_experts uniformly."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def decode_step_bytes(cfg: ModelConfig, fmt: WeightFormat, batch: int, depth: int, kv_bytes: int = 2,
                      kv_cache_bytes: float | None = None) -> float:
    """Bytes one decode step must read (and the DeltaNet state write back). kv_bytes: the activation dtype's size;
    kv_cache_bytes: per cached K or V element (None: kv_bytes; an fp8 cache: 1 + its per-row scale's share)."""
    h = cfg.hidden_size
    mat = fmt.matrix_bits / 8
    gate = fmt.gate_bits / 8
    total = 0.0
    for layer in range(cfg.num_hidden_layers):
        if cfg.is_full_attention(layer):
            q_out = cfg.num_attention_heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)
            kv = 2 * cfg.num_key_value_heads * cfg.head_dim
            total += mat * h * (q_out + kv) + mat * cfg.num_attention_heads * cfg.head_dim * h
        else:
            total += mat * h * (cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads)
            total += mat * cfg.value_dim * h
            total += cfg.conv_dim * cfg.linear_conv_kernel_dim * kv_bytes  # conv weights (unquantised)
        if cfg.sparse_layers[layer]:
            inter = cfg.moe_intermediate_size
            experts = expected_distinct_experts(cfg.num_experts, cfg.num_experts_per_tok, batch)
            total += gate * h * cfg.num_experts + experts * mat * 3 * h * inter
            if cfg.shared_expert_intermediate_size:
                total += mat * 3 * h * cfg.shared_expert_intermediate_size + gate * h
        else:
            total += mat * 3 * h * cfg.intermediate_size
    total += mat * h * cfg.vocab_size  # lm_head (or the tied embedding)
    total += batch * mat * h  # embedding rows
    n_attn = len(cfg.full_attention_layers)
    per_kv = kv_bytes if kv_cache_bytes is None else kv_cache_bytes
    total += batch * depth * n_attn * 2 * cfg.num_key_value_heads * cfg.head_dim * per_kv
    n_gdn = len(cfg.linear_attention_layers)
    state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * kv_bytes
    total += batch * n_gdn * 2 * (state + conv)  # read and written back
    return total


def roofline(step_seconds: float, step_bytes: float, ceiling: float | None) -> tuple[float, float | None]:
    """(achieved GB/s, % of the copy-bandwidth ceiling (copy_ceiling of the GPU); None without a ceiling)."""
    bps = step_bytes / step_seconds
    return bps / 1e9, None if ceiling is None else 100.0 * bps / ceiling
