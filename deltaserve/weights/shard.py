"""Loading one tensor-parallel rank's shard of a checkpoint, in every format we read.

Two wrappers around a checkpoint format, driven by the layout (model/tp_layout.py):

- `ShardedWeights` (a WeightFactory): asks the format's factory for each module at its FULL size (so the format's
  own bookkeeping, e.g. the MLX packed-width checks, sees the shapes the files hold), then cuts the module's
  (meta) parameters down to the rank's rows, columns or experts, and records for each parameter which dimension
  it cut and which full-tensor ranges it kept (`LeafSplit`).
- `ShardedFormat` (a CheckpointFormat): maps each file tensor with the format, then cuts every placement down to
  the rank's part: the placement's slot and the rank's ranges are intersected along the split dimension, the file
  tensor is narrowed (and the pieces concatenated) to match. A tensor of which the rank holds nothing (experts of
  another rank) is set aside as "other_ranks". The load plan then checks every shape against the local model as
  it does for one device.

Packed formats are cut on their own boundaries: a split along a module's input features moves in units of 32/bits
features for MLX packed words and of group_size for their scales/biases, and of 128 (the block) for FP8 block
scales (output rows too). A rank share that does not fall on such a boundary is refused, naming the tensor, the
rank's range and the unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import torch
from torch import nn

from ..model.config import ModelConfig
from ..model.layers import Experts, WeightFactory
from ..model.parallel import Parallel
from ..model.registry import model_class
from ..model.tp_layout import Split, TPLayout
from ..quant import AffineEmbedding, AffineLinear, AffineStacked, Fp8Linear, Fp8Stacked, StackedExperts
from .formats import CheckpointError, CheckpointFormat, Mapped, Placement, SetAside, TensorInfo

OTHER_RANKS = "other_ranks"  # set-aside group: tensors (experts) that another rank holds


@dataclass(frozen=True)
class LeafSplit:
    """A parameter cut along `dim`: the rank keeps full-tensor ranges `owned` (in that dimension's own units), one
    after the other; `full` is the dimension's full size."""

    dim: int
    full: int
    owned: tuple[tuple[int, int], ...]

    def with_local(self) -> list[tuple[int, int, int]]:
        """(lo, hi, local offset) per owned range."""
        out, at = [], 0
        for lo, hi in self.owned:
            out.append((lo, hi, at))
            at += hi - lo
        return out


# ---- units ---------------------------------------------------------------------------------------------------------


def _units(module: nn.Module, leaf: str, axis: str) -> tuple[int, str]:
    """(features per element of `leaf` along a module axis "out" / "in", what the unit is) for error messages."""
    if isinstance(module, (AffineLinear, AffineStacked, AffineEmbedding)) and axis == "in":
        if leaf == "weight":
            return 32 // module.spec.bits, f"{module.spec.bits}-bit codes packed in 32-bit words"
        return module.spec.group_size, f"MLX affine groups of {module.spec.group_size}"
    if isinstance(module, (Fp8Linear, Fp8Stacked)) and leaf == "weight_scale_inv":
        block = module.block[0 if axis == "out" else 1]
        return block, f"FP8 scale blocks of {block}"
    return 1, ""


def _in_units(ranges, unit: int, full: int, where: str, reason: str, rank: int, size: int):
    """Feature ranges -> ranges of a tensor whose elements cover `unit` features each (the last one may be partial
    when the features end there: FP8 scale blocks are ceil(n / 128))."""
    if unit == 1:
        return tuple(ranges), full
    out = []
    for lo, hi in ranges:
        if lo % unit or (hi % unit and hi != full):
            raise CheckpointError(
                f"{where}: tensor-parallel rank {rank} of {size} holds features [{lo}, {hi}) of {full}, which do not "
                f"fall on the boundaries of {reason} ({unit} features); choose a tensor_parallel_size that keeps "
                f"every rank's share a multiple of {unit}")
        out.append((lo // unit, ceil(hi / unit)))
    return tuple(out), ceil(full / unit)


# ---- the factory ---------------------------------------------------------------------------------------------------


class ShardedWeights:
    """WeightFactory: the inner format factory's modules at full size, cut to this rank's part (meta tensors)."""

    def __init__(self, inner: WeightFactory, layout: TPLayout):
        self.inner, self.layout = inner, layout
        self.splits: dict[str, LeafSplit] = {}  # parameter name -> how it was cut

    def linear(self, name: str, in_features: int, out_features: int) -> nn.Module:
        split = self.layout.module_split(name)
        if split is None:
            return self.inner.linear(name, in_features, out_features)
        full_in, full_out = (split.full, out_features) if split.axis == "in" else (in_features, split.full)
        module = self.inner.linear(name, full_in, full_out)
        self._cut_linear(name, module, split, stacked=False)
        if hasattr(module, "in_features"):
            module.in_features = split.local if split.axis == "in" else in_features
            module.out_features = split.local if split.axis == "out" else out_features
        return module

    def embedding(self, name: str, vocab: int, hidden: int) -> nn.Module:
        split = self.layout.module_split(name)
        module = self.inner.embedding(name, split.full, hidden)
        self._cut_linear(name, module, split, stacked=False)  # a [V, H] table: its rows are "out"
        return module

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int) -> nn.Module:
        split = self.layout.module_split(name)
        if split.axis == "expert":
            bank = self.inner.experts(name, split.full, hidden, intermediate)
        else:
            bank = self.inner.experts(name, num_experts, hidden, split.full)
        if isinstance(bank, Experts):  # gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I]
            if split.axis == "expert":
                for leaf in ("gate_up_proj", "down_proj"):
                    self._cut(f"{name}.{leaf}", bank, leaf, LeafSplit(0, split.full, split.owned))
                bank.num_experts = split.local
            else:
                full = split.full
                both = split.owned + tuple((full + lo, full + hi) for lo, hi in split.owned)
                self._cut(f"{name}.gate_up_proj", bank, "gate_up_proj", LeafSplit(1, 2 * full, both))
                self._cut(f"{name}.down_proj", bank, "down_proj", LeafSplit(2, full, split.owned))
                bank.intermediate = split.local
        elif isinstance(bank, StackedExperts):  # gate/up/down: stacked linears [E, out, in]
            for proj in ("gate_proj", "up_proj", "down_proj"):
                module = getattr(bank, proj)
                if split.axis == "expert":
                    for leaf, p in list(module.named_parameters(recurse=False)):
                        self._cut(f"{name}.{proj}.{leaf}", module, leaf, LeafSplit(0, split.full, split.owned))
                else:
                    axis = "in" if proj == "down_proj" else "out"
                    self._cut_linear(f"{name}.{proj}", module, Split(axis, split.full, split.owned), stacked=True)
        else:
            raise CheckpointError(f"{name}: tensor parallelism cannot split an expert bank of type "
                                  f"{type(bank).__name__}")
        return bank

    def _cut_linear(self, name: str, module: nn.Module, split: Split, stacked: bool) -> None:
        """Cut every parameter of a linear-like module ([out, in], [E, out, in] when stacked) along split.axis."""
        lead = int(stacked)
        for leaf, p in list(module.named_parameters(recurse=False)):
            unit, reason = _units(module, leaf, split.axis)
            dim = lead + (0 if split.axis == "out" else p.dim() - 1 - lead)
            owned, full = _in_units(split.owned, unit, split.full, f"tensor '{name}.{leaf}'", reason,
                                    self.layout.rank, self.layout.size)
            self._cut(f"{name}.{leaf}", module, leaf, LeafSplit(dim, full, owned))

    def _cut(self, param: str, module: nn.Module, leaf: str, split: LeafSplit) -> None:
        p = module._parameters[leaf]
        if p.shape[split.dim] != split.full:
            raise CheckpointError(f"parameter '{param}': dimension {split.dim} is {p.shape[split.dim]}, the "
                                  f"tensor-parallel layout expects {split.full}")
        shape = list(p.shape)
        shape[split.dim] = sum(hi - lo for lo, hi in split.owned)
        module._parameters[leaf] = nn.Parameter(torch.empty(shape, dtype=p.dtype, device=p.device),
                                                requires_grad=False)
        self.splits[param] = split


def raw_param_splits(model: nn.Module, layout: TPLayout) -> dict[str, LeafSplit]:
    """The splits of the parameters the model makes itself (conv1d weight, A_log, dt_bias): already built at the
    rank's size from the local config; recorded here so the loader cuts their file tensors."""
    out = {}
    for name, _ in model.named_parameters():
        split = layout.param_split(name)
        if split is not None:
            out[name] = LeafSplit(0, split.full, split.owned)
    return out


# ---- the format ----------------------------------------------------------------------------------------------------


def shard_placement(p: Placement, split: LeafSplit, note: str) -> Placement | None:
    """The part of placement p this rank holds (local index, file tensor narrowed), or None when it holds none."""
    index, d = tuple(p.index), split.dim
    if d < len(index):
        at = index[d]
        if isinstance(at, int):
            lo, hi = at, at + 1
        else:
            if at.step not in (None, 1):
                raise CheckpointError(f"parameter '{p.param}': a strided placement cannot be split ({note})")
            lo, hi = at.start or 0, split.full if at.stop is None else at.stop
    else:
        at, lo, hi = None, 0, split.full
    pieces = [(max(lo, a), min(hi, b), off + max(lo, a) - a) for a, b, off in split.with_local()
              if max(lo, a) < min(hi, b)]
    if not pieces:
        return None
    for (s0, e0, l0), (_, _, l1) in zip(pieces, pieces[1:]):
        if l0 + e0 - s0 != l1:  # the slot covers whole owned ranges between its ends, so their local slots abut
            raise CheckpointError(f"parameter '{p.param}': the rank's part of a placement is not contiguous ({note})")
    local_lo, local_hi = pieces[0][2], pieces[-1][2] + pieces[-1][1] - pieces[-1][0]
    if isinstance(at, int):  # the placement fills one index of this dimension: no tensor axis to narrow
        return Placement(p.param, index[:d] + (local_lo,) + index[d + 1:], p.transform, _note(p, note))
    # the file tensor's axis for dimension d: the index's slices before d keep their dimensions, its ints drop them
    axis = sum(1 for i in index[: min(d, len(index))] if not isinstance(i, int)) + max(0, d - len(index))
    cuts = [(s - lo, e - s) for s, e, _ in pieces]
    transform = _narrowed(p.transform, axis, cuts)
    total = sum(hi_ - lo_ for lo_, hi_ in split.owned)
    if d >= len(index) and local_lo == 0 and local_hi == total:
        return Placement(p.param, index, transform, _note(p, note))  # all of the local dimension, as before
    head = index[:d] if d < len(index) else index + (slice(None),) * (d - len(index))
    return Placement(p.param, head + (slice(local_lo, local_hi),) + index[d + 1:], transform, _note(p, note))


def _narrowed(transform, axis: int, cuts: list[tuple[int, int]]):
    def apply(t: torch.Tensor) -> torch.Tensor:
        t = transform(t) if transform is not None else t
        parts = [t.narrow(axis, start, n) for start, n in cuts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=axis)

    return apply


def _note(p: Placement, note: str) -> str:
    return f"{p.note}; {note}" if p.note else note


class ShardedFormat:
    """A checkpoint format whose placements are cut to one tensor-parallel rank's part (see the module doc)."""

    def __init__(self, inner: CheckpointFormat, splits: dict[str, LeafSplit], rank: int, size: int):
        self.inner, self.splits, self.rank, self.size = inner, splits, rank, size
        self.name, self.norm_offset = inner.name, inner.norm_offset

    def weight_factory(self) -> WeightFactory:
        return self.inner.weight_factory()

    def map_tensor(self, t: TensorInfo) -> Mapped | SetAside | None:
        m = self.inner.map_tensor(t)
        if not isinstance(m, Mapped):
            return m
        note = f"tensor-parallel rank {self.rank} of {self.size}"
        kept = []
        for p in m.placements:
            split = self.splits.get(p.param)
            if split is None:
                kept.append(p)
                continue
            q = shard_placement(p, split, note)
            if q is not None:
                kept.append(q)
        if not kept:
            return SetAside(OTHER_RANKS)
        return Mapped(tuple(kept), m.dtypes)

    def param_dtype(self, param: str, meta: torch.Tensor, default: torch.dtype) -> torch.dtype:
        return self.inner.param_dtype(param, meta, default)

    def source_name(self, param: str) -> str:
        return self.inner.source_name(param)

    def finalize(self, model: nn.Module) -> None:
        self.inner.finalize(model)


def build_rank_model(config: ModelConfig, fmt: CheckpointFormat, parallel: Parallel) -> tuple[nn.Module, ShardedFormat]:
    """The rank's model on the meta device and the format that loads its shard."""
    layout = TPLayout(config, parallel.rank, parallel.size, parallel.expert_parallel)
    factory = ShardedWeights(fmt.weight_factory(), layout)
    with torch.device("meta"):
        model = model_class(config.model_type)(layout.local_config(), factory, fmt.norm_offset,
                                               parallel=parallel)
    splits = {**factory.splits, **raw_param_splits(model, layout)}
    return model, ShardedFormat(fmt, splits, parallel.rank, parallel.size)
