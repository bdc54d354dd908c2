"""`deltaserve info`: what a checkpoint is and what it costs in memory, from its config (and headers if present).

The model is built on the meta device with the checkpoint format's WeightFactory, so every number is the exact
resident size deltaserve would allocate (packed codes, scales and biases for quantised modules; bf16 for dense
ones, in the dtype the loader picks; fp32 for A_log, dt_bias and FP8 block scales), without reading a byte of
weights. With no safetensors in the
directory (config only), the format follows from config.json: an MLX `quantization` entry quantises what mlx_lm
would (input width divisible by the group size, plus the per-layer overrides); an fp8 `quantization_config`
converts every linear except modules_to_not_convert.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..model.cache import cache_spec
from ..model.config import ModelConfig
from ..model.parallel import Parallel
from ..model.layers import DenseWeights
from ..model.registry import build_model
from ..quant import AffineWeights, Fp8BlockWeights
from .formats import get_format
from .loader import mtp_layers_to_load
from .plan import build_plan
from .shard import build_rank_model
from .safetensors_io import DTYPE_BYTES, SafetensorsCheckpoint

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

MTP_CLASS = "mtp head (drafting)"  # resident only when loaded for speculative decoding (load_checkpoint(mtp=True))
# (class, pattern on our parameter path); first match wins.
LAYER_CLASSES = (
    (MTP_CLASS, r"^mtp\."),
    ("embedding", r"^embed_tokens\."),
    ("lm_head", r"^lm_head\."),
    ("attention q/k/v/o", r"\.self_attn\.[qkvo]_proj\."),
    ("deltanet projections", r"\.linear_attn\.(in_proj_\w+|out_proj)\."),
    ("routed experts", r"\.mlp\.experts\."),
    ("shared expert", r"\.mlp\.shared_expert\."),
    ("router + shared gate", r"\.mlp\.(gate|shared_expert_gate)\."),
    ("dense mlp", r"\.mlp\.(gate|up|down)_proj\."),
    ("norms, conv, decay", r""),
)
_FP32_LEAVES = ("A_log", "dt_bias", "weight_scale_inv")  # held in fp32 whatever the model dtype (as the formats load)
_OVERHEAD = ("scales", "biases", "weight_scale_inv")  # bytes that are not parameters of their own


@dataclass
class CheckpointSizes:
    """What `describe_checkpoint` prints, as numbers."""

    config: ModelConfig
    kind: str  # "hf" | "mlx" | "fp8"
    config_only: bool
    rows: dict[str, list[float]]  # layer class -> [parameters, resident bytes]
    disk_bytes: int | None = None  # all safetensors tensors (MTP / vision included), None when config-only
    files: int = 0
    tensors: int = 0
    mtp_layers: int = 0  # MTP layers the checkpoint holds: their row MTP_CLASS, resident only when drafting
    tensor_parallel_size: int = 1  # > 1: rows are ONE rank's share (every rank holds the same sizes)
    expert_parallel: bool = False
    local_config: ModelConfig | None = None  # the rank's config (its heads: what its cache holds)

    @property
    def parameters(self) -> float:
        """The text model's parameters, as load_checkpoint loads it by default (without the MTP head)."""
        return sum(r[0] for k, r in self.rows.items() if k != MTP_CLASS)

    @property
    def resident_bytes(self) -> float:
        """What load_checkpoint allocates by default (the MTP head, loaded for drafting only, apart: rows[MTP_CLASS])."""
        return sum(r[1] for k, r in self.rows.items() if k != MTP_CLASS)


def checkpoint_sizes(path: str | Path, tensor_parallel_size: int = 1, expert_parallel: bool = False
                     ) -> CheckpointSizes:
    """Parameters and resident bytes by layer class, from config.json (+ safetensors headers when present); with
    tensor_parallel_size N > 1, those of one rank's shard (weights/shard.py: the shard loading would allocate)."""
    path = Path(path)
    config = ModelConfig.from_dir(path)
    ckpt = SafetensorsCheckpoint(path) if any(path.glob("*.safetensors")) else None
    mtp_layers = 0
    tp = tensor_parallel_size > 1 or expert_parallel
    if ckpt is not None:
        # the head, when there is one (never under tensor parallelism: its layers are not split)
        mtp_layers = 0 if tp else mtp_layers_to_load(config, ckpt.names, None, str(path))
        fmt = get_format(config, ckpt.names, source=str(path), mtp=mtp_layers > 0)
        factory, offset, kind = fmt.weight_factory(), fmt.norm_offset, fmt.name
    else:
        factory, offset, kind = _factory_from_config(config)
    if tp:
        model, fmt = build_rank_model(config, _SizesOnly(factory, offset, kind), _sizes_only(tensor_parallel_size,
                                                                                              expert_parallel))
        factory = fmt.weight_factory()
    else:
        with torch.device("meta"):
            model = build_model(config, factory, offset, mtp_layers=mtp_layers)
    float_dtype = DTYPES.get(config.dtype, torch.bfloat16)
    if ckpt is not None:  # the dtype the loader would pick: the float dtype most mapped bytes are in
        infos = [s.info for _, stored in ckpt.by_file() for s in stored]
        float_dtype = build_plan(infos, fmt, model, str(path)).checkpoint_float_dtype()
    sizes = CheckpointSizes(config, kind, ckpt is None, _account(model, float_dtype), mtp_layers=mtp_layers,
                            tensor_parallel_size=tensor_parallel_size, expert_parallel=expert_parallel,
                            local_config=model.config)
    if ckpt is not None:
        sizes.disk_bytes = sum(math.prod(s.info.shape) * DTYPE_BYTES[s.info.dtype] for s in ckpt.tensors.values())
        sizes.files, sizes.tensors = len(ckpt.files), len(ckpt.tensors)
    return sizes


def describe_checkpoint(path: str | Path, tensor_parallel_size: int = 1, expert_parallel: bool = False) -> str:
    """The `deltaserve info` text for a checkpoint directory: architecture, parameter count, bits per weight by layer
    class, resident size. Works on a config-only directory (sizes computed from config.json and its quantization
    entry, no weights needed). With tensor_parallel_size N > 1: one rank's shard and its cache budget."""
    s = checkpoint_sizes(path, tensor_parallel_size, expert_parallel)
    lines = [_header(Path(path), s.config, s.kind, s.config_only), _mtp_line(s)] + _table(s.rows)
    if tensor_parallel_size > 1 or expert_parallel:
        lines += _rank_budget(s)
    if s.disk_bytes is not None:
        lines.append(f"  on disk: {_size(s.disk_bytes)} in {s.files} file(s), {s.tensors} tensors "
                     "(incl. any MTP/vision)")  # fmt: skip
    return "\n".join(lines)


def _mtp_line(s: CheckpointSizes) -> str:
    """Whether the checkpoint can draft with its own MTP head (speculative decoding)."""
    declared = s.config.mtp_num_hidden_layers
    if s.tensor_parallel_size > 1 or s.expert_parallel:
        return "  MTP head: not split under tensor parallelism (no speculative decoding there); not counted"
    if s.config_only:
        return f"  MTP head: config.json declares {declared} layer(s); not counted (no weights to check)"
    if s.mtp_layers:
        return f"  MTP head: {s.mtp_layers} layer(s) (speculative decoding with the model's own draft head available)"
    return ("  MTP head: none in this checkpoint (speculative decoding with the model's own draft head unavailable; "
            "mlx-community conversions drop it)")


def _factory_from_config(config: ModelConfig):
    if config.quantization is not None:
        return AffineWeights(config.quantization, None, config.model_type), 0.0, "mlx"
    qc = config.quantization_config or {}
    if qc.get("quant_method") == "fp8":
        return Fp8BlockWeights(qc), 1.0, "fp8"
    return DenseWeights(), 1.0, "hf"


def _layer_class(param: str) -> str:
    for name, pattern in LAYER_CLASSES:
        if re.search(pattern, param):
            return name
    return LAYER_CLASSES[-1][0]


def _account(model: nn.Module, float_dtype: torch.dtype) -> dict[str, list[float]]:
    """layer class -> [parameters, resident bytes]. A packed weight counts the weights it encodes."""
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0])
    for module_name, module in model.named_modules():
        for leaf, p in module.named_parameters(recurse=False):
            name = f"{module_name}.{leaf}" if module_name else leaf
            row = rows[_layer_class(name)]
            if p.dtype.is_floating_point:
                keep32 = leaf in _FP32_LEAVES
                row[1] += p.numel() * (4 if keep32 else float_dtype.itemsize)
            else:
                row[1] += p.numel() * p.element_size()
            if leaf in _OVERHEAD:
                continue
            spec = getattr(module, "spec", None)
            row[0] += p.numel() * 32 // spec.bits if p.dtype == torch.uint32 and spec is not None else p.numel()
    return rows


def _header(path: Path, config: ModelConfig, kind: str, config_only: bool) -> str:
    c = config
    arch = ", ".join(c.raw.get("architectures") or [c.model_type])
    n_gdn, n_att = len(c.linear_attention_layers), len(c.full_attention_layers)
    ffn = (
        f"MoE {c.num_experts} experts top-{c.num_experts_per_tok} (expert {c.moe_intermediate_size}, "
        f"shared {c.shared_expert_intermediate_size})" if c.is_moe else f"dense MLP {c.intermediate_size}"
    )
    quant = {"hf": f"unquantised {c.dtype}", "fp8": "FP8 e4m3 blocks", "mlx": "MLX"}[kind]
    if kind == "mlx" and c.quantization:
        q = c.quantization
        overrides = sum(1 for k in q if k not in ("group_size", "bits", "mode"))
        quant = f"MLX affine {q.get('bits')}-bit, group {q.get('group_size')} ({overrides} per-layer overrides)"
    elif kind == "fp8":
        quant += f" {c.quantization_config.get('weight_block_size')}"
    source = "config only: sizes computed from config.json" if config_only else "config + safetensors headers"
    return "\n".join([
        f"{path}: {c.model_type} ({arch}); {quant}; {source}",
        f"  {c.num_hidden_layers} layers ({n_gdn} Gated DeltaNet + {n_att} gated attention), hidden {c.hidden_size}, "
        f"vocab {c.vocab_size}, {ffn}, tied embeddings: {c.tie_word_embeddings}",
    ])  # fmt: skip


def _table(rows: dict[str, list[float]]) -> list[str]:
    out = [f"  {'layer class':<24}{'parameters':>16}{'bits/weight':>13}{'resident':>14}"]
    total_p = total_b = 0
    for name, _ in LAYER_CLASSES:
        if name not in rows or name == MTP_CLASS:
            continue
        params, nbytes = rows[name]
        total_p, total_b = total_p + params, total_b + nbytes
        out.append(_row(name, params, nbytes))
    out.append(f"  {'total (text model)':<24}{_count(total_p):>16}{8 * total_b / max(total_p, 1):>13.2f}"
               f"{_size(total_b):>14}  ({total_b / 2**30:.2f} GiB resident)")  # fmt: skip
    if MTP_CLASS in rows:
        out.append(_row(MTP_CLASS, *rows[MTP_CLASS]) + "  (+ when loaded to draft)")
    return out


def _row(name: str, params: float, nbytes: float) -> str:
    return f"  {name:<24}{_count(params):>16}{8 * nbytes / max(params, 1):>13.2f}{_size(nbytes):>14}"


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)}"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


# ---- tensor parallelism: one rank's share --------------------------------------------------------------------------

CARDS = (("H100 80GB", 80e9), ("H200 141GB", 141e9))  # device memory, bytes
CARD_FRACTION = 0.9  # of the card for weights + cache (utils.memory.cache_budget_bytes's share of free memory)
BUDGET_SEQS = 64  # sequences whose DeltaNet state the budget lines reserve


class _NoCollectives:
    """A communicator for sizing only: `info` builds the rank's model on the meta device and never runs it."""

    def __init__(self, size: int):
        self.rank, self.size = 0, size

    def all_gather(self, x, what):
        raise RuntimeError("deltaserve info builds models to measure them, never to run them")


def _sizes_only(size: int, expert_parallel: bool) -> Parallel:
    return Parallel(0, size, _NoCollectives(size), expert_parallel)


class _SizesOnly:
    """The slice of a CheckpointFormat that build_rank_model reads, for a config-only directory."""

    def __init__(self, factory, norm_offset: float, name: str):
        self.factory, self.norm_offset, self.name = factory, norm_offset, name

    def weight_factory(self):
        return self.factory


def _rank_budget(s: CheckpointSizes) -> list[str]:
    """Per-rank lines: the split, the rank's weights, its cache per token and per sequence, what a card leaves."""
    n, local = s.tensor_parallel_size, s.local_config
    experts = "experts partitioned (expert parallel)" if s.expert_parallel else "experts split by intermediate rows"
    spec = cache_spec(local, 16, torch.bfloat16)
    kv_token = spec.bytes_per_block / 16
    lines = [
        f"  tensor parallel {n}: the table is ONE rank's share ({experts if s.config.is_moe else 'dense MLP split'};"
        f" every rank holds the same sizes); per rank {local.num_attention_heads} q / {local.num_key_value_heads} KV "
        f"heads, {local.linear_num_value_heads} / {local.linear_num_key_heads} DeltaNet value / key heads",
        f"  cache per rank (bf16): {_size(kv_token)} of KV per token, {_size(spec.bytes_per_state_slot)} of DeltaNet "
        f"state per sequence",
    ]
    for card, capacity in CARDS:
        left = CARD_FRACTION * capacity - s.resident_bytes
        if left <= 0:
            lines.append(f"  on {n} x {card}: does not fit ({_size(s.resident_bytes)} of weights per rank, "
                         f"{_size(CARD_FRACTION * capacity)} usable)")
            continue
        kv_left = left - BUDGET_SEQS * spec.bytes_per_state_slot
        tokens = f"{int(kv_left / kv_token):,} tokens of KV" if kv_left > 0 and kv_token else "no room for KV"
        lines.append(f"  on {n} x {card}: {_size(left)} per rank left for the cache at {CARD_FRACTION:.0%} of the "
                     f"card: {BUDGET_SEQS} sequences' state + {tokens}")
    return lines


# ---- what-if formats for a config-only description ------------------------------------------------------------------

WHAT_IF = ("q4", "q8", "fp8")


def with_quantization(config: dict, quant: str) -> dict:
    """config.json (a dict) with the entry a release of this model in `quant` carries: "q4" / "q8" as mlx_lm.convert
    writes them (MLX affine, group 64; routers and shared-expert gates at 8 bits), "fp8" as the Qwen FP8 releases
    (128 x 128 blocks; embeddings, lm_head, routers, shared-expert gates and in_proj_a/b not converted)."""
    import copy

    cfg = copy.deepcopy(config)
    if quant == "fp8":
        cfg["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate", "in_proj_a",
                                       "in_proj_b"],
        }  # fmt: skip
        return cfg
    if quant not in ("q4", "q8"):
        raise ValueError(f"quant {quant!r}: use one of {', '.join(WHAT_IF)}")
    text = cfg.get("text_config", cfg)
    entry = {"group_size": 64, "bits": int(quant[1]), "mode": "affine"}
    if cfg.get("model_type") == "qwen3_5_moe":
        for i in range(text["num_hidden_layers"]):
            for gate in ("mlp.gate", "mlp.shared_expert_gate"):
                entry[f"language_model.model.layers.{i}.{gate}"] = {"group_size": 64, "bits": 8}
    cfg["quantization"], cfg["quantization_config"] = entry, copy.deepcopy(entry)
    return cfg
