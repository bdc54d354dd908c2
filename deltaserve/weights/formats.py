"""Checkpoint formats are plug-ins: each one says how the tensors of a checkpoint become our model's parameters.

The loader (`weights.loader`) knows nothing about any format. It builds `Qwen3_5ForCausalLM` on the meta device
with the format's `WeightFactory` and `norm_offset`, asks the format to map every tensor name of the checkpoint,
validates the whole plan against the meta parameters (names, shapes, dtypes, coverage) BEFORE reading any data,
then materialises each parameter from its file tensor(s).

A format is a class with this shape (`CheckpointFormat` below is the typing protocol):

    class MyFormat:
        name = "mine"                                  # what detect_format() returns

        @classmethod
        def detect(cls, config, names) -> bool: ...    # ModelConfig + every tensor name of the checkpoint

        def __init__(self, config, names, mtp=False): ...  # mtp: the model holds the MTP head (`mtp.*` mapped)
        norm_offset: float                             # 1.0 for HF zero-centred norms, 0.0 when +1 is baked in
        def weight_factory(self) -> WeightFactory: ... # the modules the model is built with (dense or quantised)
        def map_tensor(self, t: TensorInfo) -> Mapped | SetAside | None: ...
        def param_dtype(self, param, meta, default) -> torch.dtype: ...
        def source_name(self, param) -> str: ...       # file tensor expected for a parameter (for error messages)
        def finalize(self, model) -> None: ...         # after every parameter is filled (e.g. repack); may no-op

`map_tensor` returns
- `Mapped(placements, dtypes)`: the file tensor goes into one or more parameters. Each `Placement` names our
  parameter (e.g. "layers.0.mlp.experts.gate_up_proj"), where in it (`index`, basic indexing: () = the whole
  parameter, (e, slice(0, I)) = expert e's gate rows) and an optional `transform` applied to the file tensor first
  (reshape/transpose/split; it MUST also work on a meta tensor, because the loader runs it on a meta tensor of the
  file shape to check shapes before loading). `dtypes` are the safetensors dtype strings the file tensor may have.
- `SetAside(group)`: a known tensor this model does not use (the MTP head when the model is built without it, the
  vision tower, a redundant tied lm_head);
  the loader records it (file, shape, dtype) and reports it; it is never silently dropped.
- `None`: an unknown tensor; the loader raises CheckpointError naming file and tensor.

Example: a plug-in for a checkpoint whose file names are our own names plus a "transformer." prefix and whose
conv weights are stored channels-last [C, K, 1]:

    class PrefixedFormat:
        name = "prefixed"

        @classmethod
        def detect(cls, config, names):
            return any(n.startswith("transformer.") for n in names)

        def __init__(self, config, names, mtp=False):
            self.config, self.norm_offset = config, 1.0

        def weight_factory(self):
            return DenseWeights()

        def map_tensor(self, t):
            if not t.name.startswith("transformer."):
                return None
            param = t.name[len("transformer."):]
            if param.endswith("conv1d.weight"):
                return Mapped((Placement(param, transform=lambda w: w.transpose(1, 2), note="[C,K,1]->[C,1,K]"),))
            return Mapped((Placement(param),))

        def param_dtype(self, param, meta, default):
            return default

        def source_name(self, param):
            return "transformer." + param

        def finalize(self, model):
            pass

Register a plug-in by adding its module to `PLUGIN_MODULES` (the module exposes `FORMAT`, the class).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Collection, Protocol

import torch
from torch import nn

from ..model.config import ModelConfig
from ..model.layers import WeightFactory

# safetensors dtype strings of the unquantised float weights we accept (an int tensor where a float is expected is
# an error, and so is F64: no published checkpoint has it and it would hide a conversion bug).
FLOAT_DTYPES = frozenset({"BF16", "F16", "F32"})

TORCH_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}


class CheckpointError(ValueError):
    """A checkpoint deltaserve cannot load; the message names the file, the tensor, what was expected and found."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its safetensors header describes it (nothing read yet)."""

    name: str
    file: str  # path of the shard holding it
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string: "BF16", "F32", "U32", "F8_E4M3", ...


@dataclass(frozen=True)
class Placement:
    """Copy (a transform of) a file tensor into `param[index]`."""

    param: str
    index: tuple = ()  # basic indexing into the parameter; () = the whole parameter
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None  # must work on meta tensors too
    note: str = ""  # says what the transform does, for error messages ("rows of group-interleaved qkvz -> q,k,v")


@dataclass(frozen=True)
class Mapped:
    placements: tuple[Placement, ...]
    dtypes: frozenset[str] = field(default=FLOAT_DTYPES)  # dtypes the FILE tensor may have


@dataclass(frozen=True)
class SetAside:
    group: str  # "mtp", "visual", "tied_lm_head", ...


class CheckpointFormat(Protocol):
    name: ClassVar[str]
    norm_offset: float

    @classmethod
    def detect(cls, config: ModelConfig, names: Collection[str]) -> bool: ...

    def weight_factory(self) -> WeightFactory: ...

    def map_tensor(self, t: TensorInfo) -> Mapped | SetAside | None: ...

    def param_dtype(self, param: str, meta: torch.Tensor, default: torch.dtype) -> torch.dtype:
        """dtype to materialise `param` in. `default` is the dtype the caller asked for (or the checkpoint's float
        dtype); packed quantised parameters keep their own dtype (meta.dtype) whatever is asked."""
        ...

    def source_name(self, param: str) -> str: ...

    def finalize(self, model: nn.Module) -> None: ...


# ---- registry --------------------------------------------------------------------------------------------------

# Plug-in modules, tried in this order before the built-in HF format; each exposes FORMAT (a CheckpointFormat
# class). A module that does not exist (yet) is skipped; an import error INSIDE it is raised. Every format module
# imports this one for its base types, so this one names them and imports them when asked (no import cycle).
PLUGIN_MODULES = ("deltaserve.weights.mlx_format", "deltaserve.weights.fp8_format")
BUILTIN_MODULE = "deltaserve.weights.hf_format"


def registered_formats() -> list[type]:
    found = []
    for mod_name in PLUGIN_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:
                continue
            raise
        found.append(mod.FORMAT)
    return found + [importlib.import_module(BUILTIN_MODULE).FORMAT]


def _quantised_hint(config: ModelConfig, names: Collection[str]) -> str | None:
    """Name the quantised format a checkpoint looks like, for the error when its plug-in is missing."""
    if config.quantization is not None or any(n.endswith(".scales") for n in names):
        return "mlx"
    qc = config.quantization_config or {}
    if qc.get("quant_method") == "fp8" or any(n.endswith(".weight_scale_inv") for n in names):
        return "fp8"
    return None


def get_format(config: ModelConfig, names: Collection[str], source: str = "checkpoint", mtp: bool = False
               ) -> CheckpointFormat:
    """The format instance for this checkpoint (first registered format whose detect() says yes). mtp: the model
    is built with the MTP head, whose `mtp.*` tensors the format then maps instead of setting them aside."""
    for fmt in registered_formats():
        if fmt.detect(config, names):
            return fmt(config, names, mtp=mtp)
    hint = _quantised_hint(config, names)
    if hint:
        raise CheckpointError(
            f"{source}: looks like a {hint!r} quantised checkpoint, but no registered format accepts it "
            f"(plug-ins: {', '.join(PLUGIN_MODULES)})"
        )
    sample = ", ".join(sorted(names)[:3])
    raise CheckpointError(
        f"{source}: no checkpoint format recognises these tensors for model_type {config.model_type!r} "
        f"(first names: {sample})"
    )


def detect_format(config: ModelConfig, header_names: Collection[str]) -> str:
    """"hf" | "mlx" | "fp8" (the `name` of the format that would load this checkpoint)."""
    return get_format(config, header_names).name
