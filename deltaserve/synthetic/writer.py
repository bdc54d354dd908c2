"""make_checkpoint: write a synthetic checkpoint in the exact published layout.

Files: config.json, tokenizer.json, tokenizer_config.json, generation_config.json, preprocessor_config.json
(vision presets), model-0000i-of-0000N.safetensors and model.safetensors.index.json (weight_map and
metadata.total_size). Each shard is streamed tensor by tensor (the header is computed from the shapes first), so
peak memory is the largest tensor in fp32 plus its cast, whatever the shard size (Qwen3.6-35B-A3B: ~3.4 GB with
fused experts, ~0.4 GB per expert; measured). Generation runs at ~15-60 M parameters/s on one CPU core.
The index is written last and shards are renamed into place when complete, so a directory with an index is a
complete checkpoint.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import torch
from tqdm import tqdm

from ..model.config import ModelConfig
from .init import Rng
from .layout import EXPERT_LAYOUTS, TensorSpec, checkpoint_tensors
from .presets import Preset, get_preset
from .tokenizer import write_tokenizer_files

DTYPES = {
    "bf16": (torch.bfloat16, "bfloat16"),
    "bfloat16": (torch.bfloat16, "bfloat16"),
    "fp32": (torch.float32, "float32"),
    "float32": (torch.float32, "float32"),
}
INDEX_NAME = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors(\.tmp)?$")


def make_checkpoint(
    out_dir: str | Path,
    preset: str | Preset,
    seed: int = 0,
    dtype: str = "bf16",
    config_only: bool = False,
    expert_layout: str | None = None,
    shard_bytes: int | None = None,
    progress: bool = True,
) -> Path:
    """Write the checkpoint of `preset` (a name in PRESETS or a Preset) to `out_dir`; returns the directory.

    dtype: "bf16" (published; A_log stays F32) or "fp32" (every tensor F32; the config says float32).
    expert_layout: "fused" | "per_expert"; None = the family's published layout (qwen3_5_moe fused,
    qwen3_next per expert). shard_bytes: shard size limit (default: the preset's; a tensor larger than the
    limit gets a shard of its own). Same (preset, seed, dtype, layout, shard_bytes) -> identical bytes.
    config_only: write config and tokenizer files only. Weights of an earlier checkpoint in out_dir are removed
    in every case (they would not match the new config or sharding).
    """
    preset = get_preset(preset)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, found {dtype!r}")
    torch_dtype, dtype_name = DTYPES[dtype]
    layout = expert_layout or preset.expert_layout
    if layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert_layout must be one of {EXPERT_LAYOUTS}, found {expert_layout!r}")
    shard_bytes = preset.shard_bytes if shard_bytes is None else shard_bytes
    if shard_bytes <= 0:
        raise ValueError(f"shard_bytes must be positive, found {shard_bytes}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _config_with_dtype(preset.config, dtype_name)
    _write_json(out / "config.json", config)
    write_tokenizer_files(out, preset)
    if preset.vision is not None:
        _write_json(out / "preprocessor_config.json", _preprocessor_config(preset))
    _remove_old_weights(out)
    if config_only:
        return out

    cfg = ModelConfig.from_dict(config, source=str(out / "config.json"))
    mtp = cfg.mtp_num_hidden_layers if preset.mtp_layers is None else preset.mtp_layers
    specs = checkpoint_tensors(cfg, preset.vision, layout, mtp)
    shards = plan_shards(specs, torch_dtype, shard_bytes)
    _write_shards(out, shards, Rng(seed), torch_dtype, f"{preset.name} seed {seed}", progress)
    return out


def plan_shards(specs: list[TensorSpec], dtype: torch.dtype, shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy split in tensor order: a shard closes when the next tensor would push it past shard_bytes."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        n = spec.nbytes(dtype)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += n
    return shards


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _write_shards(
    out: Path, shards: list[list[TensorSpec]], rng: Rng, dtype: torch.dtype, desc: str, progress: bool
) -> None:
    total = sum(s.nbytes(dtype) for shard in shards for s in shard)
    weight_map: dict[str, str] = {}
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"writing {desc}", disable=not progress) as bar:
        for i, shard in enumerate(shards):
            name = shard_name(i, len(shards))
            tmp = out / (name + ".tmp")
            write_safetensors(tmp, shard, rng, dtype, on_tensor=lambda spec: bar.update(spec.nbytes(dtype)))
            tmp.replace(out / name)
            weight_map.update((spec.name, name) for spec in shard)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(out / INDEX_NAME, index)


def write_safetensors(
    path: Path, specs: list[TensorSpec], rng: Rng, dtype: torch.dtype, on_tensor=lambda spec: None
) -> None:
    """Stream one safetensors file: the header (known from the specs alone), then each tensor's bytes as soon as it
    is generated, so at most one tensor is in memory. Format: u64 little-endian header length, JSON header
    {name: {dtype, shape, data_offsets [begin, end)}, "__metadata__": {...}} padded with spaces to a multiple of 8,
    then the raw little-endian data in header order."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        n = spec.nbytes(dtype)
        stored = torch.float32 if spec.keep_fp32 else dtype
        header[spec.name] = {"dtype": _ST_DTYPES[stored], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + n]}  # fmt: skip
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for spec in specs:
            value = _materialise(spec, rng, dtype)
            f.write(value.view(torch.uint8).numpy().data)  # no copy: the tensor's own bytes
            on_tensor(spec)
            del value
        if f.tell() != 8 + len(blob) + offset:
            raise AssertionError(f"{path}: wrote {f.tell()} bytes, header promises {8 + len(blob) + offset}")


_ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32"}


def _materialise(spec: TensorSpec, rng: Rng, dtype: torch.dtype) -> torch.Tensor:
    value = spec.make(rng)
    if tuple(value.shape) != spec.shape:
        raise AssertionError(f"layout bug: {spec.name} made with shape {tuple(value.shape)}, declared {spec.shape}")
    return value.to(torch.float32 if spec.keep_fp32 else dtype).contiguous()


def _config_with_dtype(config: dict, dtype_name: str) -> dict:
    """The preset's config with every dtype field (top level, text_config, vision_config) set to dtype_name."""
    cfg = copy.deepcopy(config)
    for section in (cfg, cfg.get("text_config"), cfg.get("vision_config")):
        if isinstance(section, dict):
            for key in ("dtype", "torch_dtype"):
                if key in section:
                    section[key] = dtype_name
    return cfg


def _preprocessor_config(preset: Preset) -> dict:
    """Image processor settings of the published Qwen3.5/3.6 checkpoints (spec 1.2), with the preset's patch sizes."""
    v = preset.vision
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": v.spatial_merge_size,
        "patch_size": v.patch_size,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "temporal_patch_size": v.temporal_patch_size,
    }


def _remove_old_weights(out: Path) -> None:
    """Rewriting a directory must not leave shards of an earlier (differently sharded) checkpoint behind."""
    (out / INDEX_NAME).unlink(missing_ok=True)
    for path in out.iterdir():
        if _SHARD_RE.match(path.name):
            path.unlink()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
