"""`deltaserve quantize`: any loadable checkpoint -> an MLX affine checkpoint (loads in mlx_lm and deltaserve).

How: the input's own format plug-in maps its tensors onto our parameters (the loader's plan, checked before any
data is read); then, one module at a time, the module's parameters are read, made dense (dequantised if the input
is FP8 or MLX), written in MLX's layout and dropped. Peak memory is one module (one layer's expert bank at most)
plus one output shard, never the model.

MLX layout written (spec 4.1, what mlx_lm.convert writes, tensor for tensor):
- names `language_model.model.*` / `language_model.lm_head`, experts as stacked `mlp.switch_mlp.{gate,up,down}_proj`;
- every linear, embedding and expert bank whose input width is a multiple of group_size is quantised with MLX's
  affine rule (kernels.quant.affine_quantize, bit-exact with mx.quantize); MoE routers (`mlp.gate`) and
  `shared_expert_gate` get 8 bits, group 64, recorded as per-layer overrides;
- conv1d as [C, K, 1]; zero-centred norms with +1 baked in (linear_attn.norm unchanged);
- floats cast to the config's dtype first (as mlx_lm does), except A_log; vision tensors are not written (mlx_lm
  drops them too) and `vision_config` is removed from config.json;
- the MTP head (`mtp.*`, the draft head of speculative decoding), when the input has one, is kept under its
  top-level names with the body's conventions (quant.mlx_names: switch_mlp experts, +1 norms, 8-bit router and
  shared gate overrides) for qwen3_5*: mlx_lm drops every `mtp.` key when it loads those, so the output still
  loads there. Not for qwen3_next, whose mlx_lm loader keeps an MLX checkpoint's `mtp.` keys and then refuses
  them.
"""

from __future__ import annotations

import copy
import ctypes
import json
import shutil
import struct
from pathlib import Path
from typing import Iterator, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from ..kernels.quant import affine_dequantize, affine_quantize, check_affine_spec, fp8_block_dequantize
from ..model.config import ModelConfig
from ..model.layers import Embedding, Experts, Linear
from ..model.norm import RMSNorm
from ..model.registry import build_model
from ..quant import mlx_names
from ..quant.affine import AffineEmbedding, AffineLinear, AffineStacked
from ..quant.fp8 import Fp8Linear, Fp8Stacked
from ..quant.modules import DenseEmbedding, DenseLinear, DenseStacked
from .formats import Placement, TensorInfo, get_format
from .loader import mtp_layers_to_load
from .plan import build_plan
from .safetensors_io import SafetensorsCheckpoint, ShardReader

SHARD_BYTES = 5 << 30  # as mlx_lm (max_file_size_gb=5); shards are streamed to disk, not held in RAM
_NEXT_FUSED = (".in_proj_qkv", ".in_proj_z", ".in_proj_b", ".in_proj_a")
MLX_KEEPS_MTP = ("qwen3_5", "qwen3_5_moe")  # model types whose MLX output keeps the MTP head (mlx_lm drops it)
GATE_OVERRIDE = {"group_size": 64, "bits": 8}  # mlx_lm's qwen3_5 quant_predicate for routers and shared gates
OUTPUT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
COPIED_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
    "preprocessor_config.json", "video_preprocessor_config.json",
)  # fmt: skip


class TensorSource(Protocol):
    """Where input tensors come from: a checkpoint on disk, or a synthetic generator."""

    label: str
    infos: list[TensorInfo]

    def read(self, info: TensorInfo) -> torch.Tensor: ...


class CheckpointSource:
    """The tensors of a (sharded) safetensors checkpoint, read one at a time."""

    def __init__(self, path: Path):
        self.ckpt = SafetensorsCheckpoint(path)
        self.label = str(path)
        self.infos = [s.info for _, stored in self.ckpt.by_file() for s in stored]
        self._readers: dict[str, ShardReader] = {}

    def read(self, info: TensorInfo) -> torch.Tensor:
        reader = self._readers.get(info.file)
        if reader is None:
            reader = self._readers[info.file] = ShardReader(info.file).__enter__()
        return reader.get(self.ckpt.tensors[info.name])

    def close(self) -> None:
        for reader in self._readers.values():
            reader.__exit__(None, None, None)
        self._readers.clear()


def quantize_checkpoint(
    in_dir: str | Path, out_dir: str | Path, bits: int = 4, group_size: int = 64, progress: bool = True
) -> Path:
    """Quantise the checkpoint in `in_dir` (HF bf16/fp16/fp32, Qwen FP8, or MLX) into `out_dir` in MLX's layout.

    Streams tensor by tensor (never a full dense copy of the model in RAM). Writes `model*.safetensors` (+ index),
    a config.json with the `quantization` entry (mirrored in `quantization_config`; routers and shared-expert gates
    8-bit group 64 as mlx_lm does) and copies the tokenizer/generation files. bits in {2,3,4,5,6,8}, group_size in
    {32,64,128}; anything else raises ValueError. Shows a tqdm bar when progress. Returns out_dir.
    """
    check_affine_spec(bits, group_size, "quantize")
    src, out = Path(in_dir), Path(out_dir)
    if out.resolve() == src.resolve():
        raise ValueError(f"{out}: the output directory must differ from the input checkpoint")
    if out.exists() and any(out.glob("*.safetensors")):
        raise ValueError(f"{out}: already holds safetensors files; choose an empty or new directory")
    config = ModelConfig.from_dir(src)
    source = CheckpointSource(src)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_mlx_checkpoint(config, source, out, bits, group_size, progress)
    finally:
        source.close()
    for name in COPIED_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out


def write_mlx_checkpoint(
    config: ModelConfig,
    source: TensorSource,
    out: Path,
    bits: int,
    group_size: int,
    progress: bool = True,
    shard_bytes: int = SHARD_BYTES,
) -> dict:
    """Write `source` (any loadable layout of `config`) to `out` as an MLX affine checkpoint: shards, index and
    config.json. Returns the `quantization` entry written."""
    check_affine_spec(bits, group_size, "quantize")
    names = [t.name for t in source.infos]
    keep = None if config.model_type in MLX_KEEPS_MTP else False  # keep the head when the input has one
    mtp_layers = mtp_layers_to_load(config, names, keep, source.label)
    fmt = get_format(config, names, source=source.label, mtp=mtp_layers > 0)
    with torch.device("meta"):
        model = build_model(config, fmt.weight_factory(), fmt.norm_offset, mtp_layers=mtp_layers)
    plan = build_plan(source.infos, fmt, model, source.label)
    feeds: dict[str, list[tuple[TensorInfo, Placement]]] = {}
    by_name = {t.name: t for t in source.infos}
    for name, placements in plan.placements.items():
        for p in placements:
            feeds.setdefault(p.param, []).append((by_name[name], p))
    emitter = _Emitter(config, bits, group_size, _output_dtype(config))
    writer = _ShardWriter(out, shard_bytes)
    pieces = sum(len(p) for p in plan.placements.values())  # a fused qwen3_next tensor feeds two parameters
    bar = tqdm(total=pieces, desc="quantizing", unit="tensor", disable=not progress)
    for module_name, module in model.named_modules():
        params = dict(module.named_parameters(recurse=False))
        if not params:
            continue
        values = {leaf: _read_param(source, feeds[_join(module_name, leaf)], p, bar) for leaf, p in params.items()}
        for mlx_name, tensor in emitter.emit(module_name, module, values):
            writer.add(mlx_name, tensor)
        del values
        _release_freed_memory()
    bar.close()
    writer.finish()
    cfg = copy.deepcopy(config.raw)
    cfg.pop("vision_config", None)
    cfg["quantization"] = emitter.entry
    cfg["quantization_config"] = copy.deepcopy(emitter.entry)
    (out / "config.json").write_text(json.dumps(dict(sorted(cfg.items())), indent=4) + "\n")
    return emitter.entry


def _join(module: str, leaf: str) -> str:
    return f"{module}.{leaf}" if module else leaf


def _output_dtype(config: ModelConfig) -> torch.dtype | None:
    """The dtype mlx_lm.convert casts floats to: torch_dtype, else text_config.dtype; None = keep each tensor's."""
    raw = config.raw
    name = raw.get("torch_dtype") or (raw.get("text_config") or {}).get("dtype")
    return OUTPUT_DTYPES.get(name)


def _read_param(
    source: TensorSource, pieces: list[tuple[TensorInfo, Placement]], meta: torch.Tensor, bar: tqdm
) -> torch.Tensor:
    """One parameter assembled from its file tensor(s), in the file dtype (packed ones stay packed)."""
    buf = None
    for info, p in pieces:
        t = source.read(info)
        t = p.transform(t) if p.transform is not None else t
        bar.update(1)
        if not p.index and len(pieces) == 1:
            return t
        if buf is None:
            dtype = t.dtype if meta.dtype.is_floating_point else meta.dtype
            buf = torch.empty(meta.shape, dtype=dtype)
        buf[p.index].copy_(t)
    return buf


class _Emitter:
    """Our modules (read, dense or packed) -> MLX-named output tensors; collects the `quantization` entry."""

    def __init__(self, config: ModelConfig, bits: int, group_size: int, dtype: torch.dtype | None):
        self.config, self.bits, self.group_size, self.dtype = config, bits, group_size, dtype
        self.entry: dict = {"group_size": group_size, "bits": bits, "mode": "affine"}
        self._held: dict[str, torch.Tensor] = {}  # qwen3_next halves waiting for their partner

    def emit(self, name: str, module: nn.Module, v: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        dense = self._dense(name, module, v)
        if dense is not None and self.config.model_type == "qwen3_next" and name.endswith(_NEXT_FUSED):
            yield from self._fuse_next(name, dense)
            return
        if dense is not None:  # a quantisable weight: linear / embedding / one stacked expert projection
            yield from self._quantisable(name, dense)
            return
        if isinstance(module, Experts):  # our fused dense experts -> MLX's three stacked projections
            inter = module.intermediate
            gate_up = v["gate_up_proj"]
            yield from self._quantisable(f"{name}.gate_proj", gate_up[:, :inter])
            yield from self._quantisable(f"{name}.up_proj", gate_up[:, inter:])
            yield from self._quantisable(f"{name}.down_proj", v["down_proj"])
            return
        for leaf, value in v.items():
            yield self._mlx(_join(name, leaf)), self._plain(name, module, leaf, value)

    def _fuse_next(self, name: str, dense: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """qwen3_next: MLX keeps the group-interleaved in_proj_qkvz / in_proj_ba; rebuild them from our four."""
        self._held[name] = dense
        prefix = name.rsplit(".", 1)[0]
        cfg = self.config
        hk = cfg.linear_num_key_heads
        if name.endswith("in_proj_z"):
            qkv, z = self._held.pop(f"{prefix}.in_proj_qkv"), self._held.pop(name)
            q, k, v = qkv.split([cfg.key_dim, cfg.key_dim, cfg.value_dim])
            yield from self._quantisable(f"{prefix}.in_proj_qkvz", _interleave_groups([q, k, v, z], hk))
        elif name.endswith("in_proj_a"):
            b, a = self._held.pop(f"{prefix}.in_proj_b"), self._held.pop(name)
            yield from self._quantisable(f"{prefix}.in_proj_ba", _interleave_groups([b, a], hk))

    def _dense(self, name: str, module: nn.Module, v: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The dense [..., out, in] weight of a quantisable module, dequantising packed inputs; else None."""
        if isinstance(module, (Linear, DenseLinear, Embedding, DenseEmbedding, DenseStacked)):
            return v["weight"]
        if isinstance(module, (AffineLinear, AffineEmbedding, AffineStacked)):
            s = module.spec
            return affine_dequantize(v["weight"], v["scales"], v["biases"], s.bits, s.group_size)
        if isinstance(module, (Fp8Linear, Fp8Stacked)):
            return fp8_block_dequantize(v["weight"], v["weight_scale_inv"], module.block, self.dtype or torch.bfloat16)
        return None

    def _plain(self, name: str, module: nn.Module, leaf: str, value: torch.Tensor) -> torch.Tensor:
        if leaf == "A_log":
            return value.contiguous()  # kept in its own dtype (mlx_lm's cast_predicate)
        if isinstance(module, RMSNorm) and module.offset:
            value = value + module.offset  # bake the +1 in, in the source dtype (as mlx_lm's sanitize)
        if name.endswith("conv1d") and leaf == "weight":
            value = value.transpose(1, 2)  # [C, 1, K] -> MLX [C, K, 1]
        return self._cast(value)

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        return (t.to(self.dtype) if self.dtype is not None else t).contiguous()

    def _mlx(self, path: str) -> str:
        return mlx_names.to_mlx(path, self.config.model_type)

    def _quantisable(self, name: str, weight: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        weight = self._cast(weight)
        in_features = weight.shape[-1]
        mlx = self._mlx(name)
        spec = None
        if in_features % self.group_size == 0:  # mlx_lm quantises nothing else
            spec = {"group_size": self.group_size, "bits": self.bits}
            if self.config.is_moe and name.endswith(("mlp.gate", "shared_expert_gate")):
                spec = dict(GATE_OVERRIDE) if in_features % GATE_OVERRIDE["group_size"] == 0 else None
                if spec is not None:
                    self.entry[mlx] = spec
        if spec is None:
            yield f"{mlx}.weight", weight
            return
        packed, scales, biases = _quantize_rows(weight, spec["bits"], spec["group_size"])
        yield f"{mlx}.weight", packed
        yield f"{mlx}.scales", scales
        yield f"{mlx}.biases", biases


def _interleave_groups(parts: list[torch.Tensor], groups: int) -> torch.Tensor:
    """Row blocks part-major ([all q; all k; ...]) -> group-major ([q_0, k_0, ..., q_1, k_1, ...]); the inverse of
    names._group_rows. parts[i] is [groups * rows_i, in]."""
    split = [p.reshape(groups, p.shape[0] // groups, *p.shape[1:]) for p in parts]
    return torch.cat(split, dim=1).reshape(-1, *parts[0].shape[1:])


def _quantize_rows(w: torch.Tensor, bits: int, group_size: int, rows: int = 2048):
    """affine_quantize over [..., out, in] a block of rows at a time, into preallocated outputs (bounds the fp32
    and integer temporaries to a few MB whatever the tensor size)."""
    lead, n = w.shape[:-1], w.shape[-1]
    flat = w.reshape(-1, n)
    packed = torch.empty(flat.shape[0], n * bits // 32, dtype=torch.uint32)
    scales = torch.empty(flat.shape[0], n // group_size, dtype=w.dtype)
    biases = torch.empty_like(scales)
    for r in range(0, flat.shape[0], rows):
        packed[r : r + rows], scales[r : r + rows], biases[r : r + rows] = affine_quantize(flat[r : r + rows], bits,
                                                                                          group_size)
    return packed.reshape(*lead, -1), scales.reshape(*lead, -1), biases.reshape(*lead, -1)


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc). The quantiser frees a module's tensors every step; glibc's
    dynamic mmap threshold would otherwise keep them in the heap, and the process's RSS would climb past the
    size of the dense model although only one module is ever alive."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_libc()


_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.uint32: "U32",
              torch.uint8: "U8", torch.int32: "I32"}
_COPY_CHUNK = 64 << 20


class _ShardWriter:
    """Writes output tensors to disk as they come: `model-0000i-of-0000N.safetensors` shards of ~shard_bytes + index.

    A safetensors file starts with its header (names, dtypes, shapes, offsets), which is only known once the shard
    is complete; so each tensor's bytes go straight to a data file (from the tensor's memory, no copy), and closing
    the shard writes u64 header length + JSON header (padded to 8 bytes) + the data. Nothing of the output stays in
    RAM (safetensors.torch.save_file would hold the whole shard, and build a bytes copy of it on top).
    """

    def __init__(self, out: Path, shard_bytes: int):
        self.out, self.shard_bytes = out, shard_bytes
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0
        self._header: dict = {}
        self._data = None
        self._size = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        n = tensor.numel() * tensor.element_size()
        if self._header and self._size + n > self.shard_bytes:
            self._close_shard()
        if self._data is None:
            self._data = open(self._path(".data.tmp"), "wb")
        self._header[name] = {"dtype": _ST_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                              "data_offsets": [self._size, self._size + n]}  # fmt: skip
        if n:
            self._data.write(memoryview(tensor.contiguous().view(-1).view(torch.uint8).numpy()))
        self._size += n
        self.total += n

    def _path(self, suffix: str) -> Path:
        return self.out / f"model-{len(self.files) + 1:05d}.safetensors{suffix}"

    def _close_shard(self) -> None:
        data_path, path = self._path(".data.tmp"), self._path(".tmp")
        if self._data is not None:
            self._data.close()
        raw = json.dumps({"__metadata__": {"format": "mlx"}, **self._header}, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            if data_path.exists():
                with open(data_path, "rb") as d:
                    shutil.copyfileobj(d, f, _COPY_CHUNK)
        data_path.unlink(missing_ok=True)
        self.files.append((path, list(self._header)))
        self._header, self._data, self._size = {}, None, 0

    def finish(self) -> None:
        if self._header or not self.files:
            self._close_shard()
        n = len(self.files)
        weight_map = {}
        for i, (tmp, names) in enumerate(self.files):
            final = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            tmp.replace(self.out / final)
            weight_map.update({name: final for name in names})
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=4) + "\n")


__all__ = ["CheckpointSource", "TensorSource", "quantize_checkpoint", "write_mlx_checkpoint"]
