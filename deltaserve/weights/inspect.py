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

from ..model.config import ModelConfig
from ..model.layers import DenseWeights
from ..model.registry import build_model
from ..quant import AffineWeights, Fp8BlockWeights
from .formats import get_format
from .loader import mtp_layers_to_load
from .plan import build_plan
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

    @property
    def parameters(self) -> float:
        """The text model's parameters, as load_checkpoint loads it by default (without the MTP head)."""
        return sum(r[0] for k, r in self.rows.items() if k != MTP_CLASS)

    @property
    def resident_bytes(self) -> float:
        """What load_checkpoint allocates by default (the MTP head, loaded for drafting only, apart: rows[MTP_CLASS])."""
        return sum(r[1] for k, r in self.rows.items() if k != MTP_CLASS)


def checkpoint_sizes(path: str | Path) -> CheckpointSizes:
    """Parameters and resident bytes by layer class, from config.json (+ safetensors headers when present)."""
    path = Path(path)
    config = ModelConfig.from_dir(path)
    ckpt = SafetensorsCheckpoint(path) if any(path.glob("*.safetensors")) else None
    mtp_layers = 0
    if ckpt is not None:
        mtp_layers = mtp_layers_to_load(config, ckpt.names, None, str(path))  # the head, when there is one
        fmt = get_format(config, ckpt.names, source=str(path), mtp=mtp_layers > 0)
        factory, offset, kind = fmt.weight_factory(), fmt.norm_offset, fmt.name
    else:
        factory, offset, kind = _factory_from_config(config)
    with torch.device("meta"):
        model = build_model(config, factory, offset, mtp_layers=mtp_layers)
    float_dtype = DTYPES.get(config.dtype, torch.bfloat16)
    if ckpt is not None:  # the dtype the loader would pick: the float dtype most mapped bytes are in
        infos = [s.info for _, stored in ckpt.by_file() for s in stored]
        float_dtype = build_plan(infos, fmt, model, str(path)).checkpoint_float_dtype()
    sizes = CheckpointSizes(config, kind, ckpt is None, _account(model, float_dtype), mtp_layers=mtp_layers)
    if ckpt is not None:
        sizes.disk_bytes = sum(math.prod(s.info.shape) * DTYPE_BYTES[s.info.dtype] for s in ckpt.tensors.values())
        sizes.files, sizes.tensors = len(ckpt.files), len(ckpt.tensors)
    return sizes


def describe_checkpoint(path: str | Path) -> str:
    """The `deltaserve info` text for a checkpoint directory: architecture, parameter count, bits per weight by layer
    class, resident size. Works on a config-only directory (sizes computed from config.json and its quantization
    entry, no weights needed)."""
    s = checkpoint_sizes(path)
    lines = [_header(Path(path), s.config, s.kind, s.config_only), _mtp_line(s)] + _table(s.rows)
    if s.disk_bytes is not None:
        lines.append(f"  on disk: {_size(s.disk_bytes)} in {s.files} file(s), {s.tensors} tensors "
                     "(incl. any MTP/vision)")  # fmt: skip
    return "\n".join(lines)


def _mtp_line(s: CheckpointSizes) -> str:
    """Whether the checkpoint can draft with its own MTP head (speculative decoding)."""
    declared = s.config.mtp_num_hidden_layers
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
