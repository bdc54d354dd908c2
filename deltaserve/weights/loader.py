"""load_checkpoint: a checkpoint directory -> a ready model (model/registry.py by model_type; eval mode, on `device`).

Steps: parse config.json; validate every safetensors header; pick the format plug-in; build the model on the meta
device (no memory); map and check every tensor against the meta parameters (`plan.build_plan`: nothing read yet);
then read tensor by tensor, converting dtype and moving to `device` as each arrives. A parameter filled from one
tensor takes that tensor (converted) as its storage; one assembled from several (stacked per-expert weights) is
allocated once and filled slice by slice. So peak memory stays about the model's size plus the largest tensor,
never twice the model.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..model.config import ConfigError, ModelConfig
from ..model.parallel import Parallel
from ..model.registry import build_model
from ..model.vision import VisionTower
from .formats import CheckpointError, CheckpointFormat, TensorInfo, get_format
from .names import MTP_PREFIX
from .plan import LoadPlan, build_plan
from .safetensors_io import DTYPE_BYTES, SafetensorsCheckpoint
from .shard import build_rank_model
from .vision_format import VisionFormat

log = logging.getLogger("deltaserve.weights")


@dataclass
class LoadedCheckpoint:
    model: nn.Module  # the model_type's causal LM (model/registry.py)
    config: ModelConfig
    set_aside: dict[str, list[str]]  # group ("mtp", "visual", "tied_lm_head") -> file tensor names
    path: Path
    format: str  # "hf" | "mlx" | "fp8"
    set_aside_info: dict[str, TensorInfo] = field(default_factory=dict)  # name -> file, shape, dtype
    num_tensors: int = 0  # file tensors loaded into parameters
    vision: VisionTower | None = None  # loaded only when asked for (load_checkpoint(vision=True))

    def summary(self) -> str:
        n_params = sum(p.numel() for p in self.model.parameters())
        n_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        lines = [
            f"{self.path}: format {self.format}, {self.num_tensors} tensors -> {n_params:,} parameters "
            f"({n_bytes / 2**20:.1f} MiB)"
        ]
        if self.model.mtp is not None:
            lines.append(f"  mtp head: {self.model.mtp.num_layers} layer(s) loaded (speculative decoding available)")
        for group, names in sorted(self.set_aside.items()):
            size = sum(_nbytes(self.set_aside_info[n]) for n in names)
            lines.append(f"  set aside: {group}: {len(names)} tensors ({size / 2**20:.1f} MiB), not loaded")
        if self.vision is not None:
            n = sum(p.numel() for p in self.vision.parameters())
            lines.append(f"  vision tower: {self.vision.config.depth} blocks, {n:,} parameters")
        return "\n".join(lines)


_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


def has_mtp_tensors(names) -> bool:
    """Whether a checkpoint's tensor names hold an MTP head in the published layout (top-level `mtp.*`)."""
    return any(n.startswith(MTP_PREFIX) for n in names)


def mtp_layers_to_load(config: ModelConfig, names, mtp: bool | None, source: str) -> int:
    """How many MTP layers to build the model with: config.mtp_num_hidden_layers when the head is wanted (mtp True,
    or None and the checkpoint has it), else 0. mtp True and no head: CheckpointError saying drafting is
    unavailable and why."""
    present = has_mtp_tensors(names)
    n = config.mtp_num_hidden_layers
    if n == 0 and config.model_type == "qwen3_next" and present:
        # Qwen3-Next configs carry no MTP field although the checkpoints hold the head (vLLM's
        # num_nextn_predict_layers defaults to 1): count its layers from the names.
        n = len({m.group(1) for m in map(_MTP_LAYER.match, names) if m})
    if mtp is False or (mtp is None and not (present and n > 0)):
        return 0
    if n <= 0:
        raise CheckpointError(f"{source}: config.json declares no MTP layers (mtp_num_hidden_layers is {n}), so "
                              "speculative decoding with the model's own draft head is unavailable")
    if not present:
        raise CheckpointError(
            f"{source}: no MTP head in this checkpoint (no 'mtp.*' tensors; config.json declares {n} MTP layer(s)), "
            "so speculative decoding with the model's own draft head is unavailable. mlx-community conversions drop "
            "the head: quantize the Hugging Face release with `deltaserve quantize`, which keeps it")
    return n


def _nbytes(t: TensorInfo) -> int:
    return math.prod(t.shape) * DTYPE_BYTES[t.dtype]


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, progress: bool = True,
    vision: bool = False, mtp: bool | None = False, parallel: Parallel | None = None,
) -> LoadedCheckpoint:
    """Load a checkpoint directory. dtype None keeps the checkpoint's float dtype (the one most bytes are in).

    vision: also load the vision tower (`LoadedCheckpoint.vision`) from the tensors the text model sets aside as
    "visual"; an error if the checkpoint has none (a text-only conversion). Off: they are only recorded.
    mtp: also load the MTP head (`model.mtp`, the draft head of speculative decoding): True requires it (a
    CheckpointError saying drafting is unavailable and why), None loads it when the checkpoint has one, False (the
    default, as for the vision tower) sets its tensors aside.
    parallel (size > 1): build and load only this tensor-parallel rank's shard (weights/shard.py); the MTP head is
    not split, so it is set aside (mtp=True is refused)."""
    path = Path(path)
    try:
        config = ModelConfig.from_dir(path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    ckpt = SafetensorsCheckpoint(path)
    infos = [s.info for _, stored in ckpt.by_file() for s in stored]
    sharded = parallel is not None and parallel.size > 1
    if sharded and mtp:
        raise CheckpointError(f"{path}: the MTP head is not split under tensor parallelism (speculative decoding "
                              "with tensor_parallel_size > 1 is not supported)")
    mtp_layers = 0 if sharded else mtp_layers_to_load(config, ckpt.names, mtp, str(path))
    fmt = get_format(config, ckpt.names, source=str(path), mtp=mtp_layers > 0)
    if sharded:
        model, fmt = build_rank_model(config, fmt, parallel)
    else:
        with torch.device("meta"):
            model = build_model(config, fmt.weight_factory(), fmt.norm_offset, mtp_layers=mtp_layers)
    plan = build_plan(infos, fmt, model, str(path))
    _materialise(model, ckpt, plan, fmt, torch.device(device), dtype or plan.checkpoint_float_dtype(), progress)
    fmt.finalize(model)
    model.fuse_projections()  # shared-input projections -> one weight each (views: no memory growth)
    model.eval()
    tower = None
    if vision:
        tower = _load_vision(config, ckpt, plan.set_aside.pop("visual", []), torch.device(device),
                             dtype or plan.checkpoint_float_dtype(), str(path))
    set_aside = {g: [t.name for t in ts] for g, ts in plan.set_aside.items()}
    info = {t.name: t for ts in plan.set_aside.values() for t in ts}
    loaded = LoadedCheckpoint(model, config, set_aside, path, fmt.name, info, len(plan.placements), tower)
    log.info("%s", loaded.summary())
    return loaded


def _load_vision(config: ModelConfig, ckpt: SafetensorsCheckpoint, tensors: list[TensorInfo], device: torch.device,
                 dtype: torch.dtype, source: str) -> VisionTower:
    """The vision tower from its tensors (every one used exactly once, as for the text model)."""
    try:
        vcfg = config.vision()
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    if vcfg is None:
        raise CheckpointError(f"{source}: config.json has no vision_config: a text-only checkpoint")
    fmt = VisionFormat(config, vcfg, [t.name for t in tensors], source)
    with torch.device("meta"):
        tower = VisionTower(vcfg, fmt.linear_factory)
    plan = build_plan(tensors, fmt, tower, source)
    _materialise(tower, ckpt, plan, fmt, device, dtype, progress=False)
    return tower.eval()


def _materialise(
    model: nn.Module,
    ckpt: SafetensorsCheckpoint,
    plan: LoadPlan,
    fmt: CheckpointFormat,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool,
) -> None:
    meta = dict(model.named_parameters())
    final = {name: fmt.param_dtype(name, p, dtype) for name, p in meta.items()}
    pending = dict(plan.pieces)  # param -> slots still to fill
    partial: dict[str, torch.Tensor] = {}  # params assembled from several tensors, allocated once
    bar = tqdm(total=len(plan.placements), desc="loading", unit="tensor", disable=not progress)
    for file, stored in ckpt.by_file():
        with ckpt.read_file(file) as reader:
            for s in stored:
                placements = plan.placements.get(s.info.name)
                if placements is None:  # set aside
                    continue
                tensor = reader.get(s)
                for p in placements:
                    src = p.transform(tensor) if p.transform is not None else tensor
                    if pending[p.param] == 1 and not p.index and p.param not in partial:
                        _install(model, p.param, _owned(src, device, final[p.param]))
                    else:
                        buf = partial.get(p.param)
                        if buf is None:
                            buf = partial[p.param] = torch.empty(meta[p.param].shape, dtype=final[p.param], device=device)
                        buf[p.index].copy_(src)
                    pending[p.param] -= 1
                    if pending[p.param] == 0 and p.param in partial:
                        _install(model, p.param, partial.pop(p.param))
                del tensor, src
                bar.update(1)
    bar.close()
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:  # build_plan guarantees coverage; this guards against a format that breaks its own contract
        raise CheckpointError(f"{ckpt.path}: parameters left unloaded after loading: {', '.join(left[:8])}")


def _owned(src: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """src on device in dtype, contiguous, holding no more storage than itself.

    The reader's buffers are owned, so an unchanged whole tensor is kept without a copy; a view of part of a buffer
    (a transform that slices) is copied, so the parameter does not pin the whole file tensor."""
    out = src.to(device=device, dtype=dtype).contiguous()
    if out.untyped_storage().nbytes() > out.numel() * out.element_size():
        out = out.clone()
    return out


def _install(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    module._parameters[leaf] = nn.Parameter(value, requires_grad=False)
