"""The load plan: every checkpoint tensor mapped and checked against the meta-device model BEFORE any data is read.

Invariants established by `build_plan` (each violation is a CheckpointError naming file, tensor, expected, found):
- every file tensor is either mapped to parameter slots or set aside by the format; unknown tensors are refused;
- each file tensor's dtype is one the format allows for it (e.g. floats only for dense weights);
- each placement's (transformed) shape equals the parameter slot it fills (checked on meta tensors: no data read);
- no parameter slot is filled twice, and every parameter is filled completely (sum of slot sizes == numel; slots
  of one parameter are distinct indices, which the formats make disjoint).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from .formats import TORCH_DTYPES, CheckpointError, CheckpointFormat, Mapped, Placement, SetAside, TensorInfo

MAX_LISTED = 8  # how many missing parameters an error lists before "... and N more"


@dataclass
class LoadPlan:
    placements: dict[str, tuple[Placement, ...]] = field(default_factory=dict)  # file tensor -> its slots
    pieces: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # param -> number of slots
    set_aside: dict[str, list[TensorInfo]] = field(default_factory=lambda: defaultdict(list))  # group -> tensors
    float_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # float dtype -> mapped bytes

    def checkpoint_float_dtype(self) -> torch.dtype:
        """The float dtype holding most of the mapped bytes: the model dtype when the caller asks for none."""
        if not self.float_bytes:
            return torch.bfloat16
        return TORCH_DTYPES[max(self.float_bytes, key=self.float_bytes.__getitem__)]


def build_plan(tensors: list[TensorInfo], fmt: CheckpointFormat, model: nn.Module, source: str) -> LoadPlan:
    params = dict(model.named_parameters())
    plan = LoadPlan()
    filled: dict[str, int] = defaultdict(int)  # param -> elements covered
    seen: dict[tuple[str, str], str] = {}  # (param, index repr) -> "file: tensor" that filled it
    by_lead: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # param -> leading index -> elements
    for t in tensors:
        mapping = fmt.map_tensor(t)
        if mapping is None:
            raise CheckpointError(
                f"{t.file}: unexpected tensor '{t.name}' ({t.dtype} {list(t.shape)}): no parameter of this "
                f"{model.config.model_type} model takes it in format '{fmt.name}'"
            )
        if isinstance(mapping, SetAside):
            plan.set_aside[mapping.group].append(t)
            continue
        _check_dtype(t, mapping)
        for p in mapping.placements:
            slot = _check_placement(t, p, params)
            key = (p.param, repr(p.index))
            if key in seen:
                raise CheckpointError(
                    f"{t.file}: tensor '{t.name}' fills parameter '{p.param}'{_where(p)}, already filled by {seen[key]}"
                )
            seen[key] = f"{t.file}: tensor '{t.name}'"
            filled[p.param] += slot.numel()
            if p.index and isinstance(p.index[0], int):
                by_lead[p.param][p.index[0]] += slot.numel()
            if filled[p.param] > params[p.param].numel():
                raise CheckpointError(
                    f"{t.file}: tensor '{t.name}' overlaps other tensors filling parameter '{p.param}' "
                    f"(e.g. fused and per-expert copies of the same experts)"
                )
            plan.pieces[p.param] += 1
        plan.placements[t.name] = mapping.placements
        if t.dtype in ("BF16", "F16", "F32"):
            plan.float_bytes[t.dtype] += math.prod(t.shape)
    _check_complete(params, filled, by_lead, fmt, source)
    return plan


def _where(p: Placement) -> str:
    return f" at index {_fmt_index(p.index)}" if p.index else ""


def _fmt_index(index: tuple) -> str:
    parts = [f"{s.start}:{s.stop}" if isinstance(s, slice) else str(s) for s in index]
    return "[" + ", ".join(parts) + "]"


def _check_dtype(t: TensorInfo, mapping: Mapped) -> None:
    if t.dtype not in mapping.dtypes:
        targets = ", ".join(sorted({p.param for p in mapping.placements}))
        raise CheckpointError(
            f"{t.file}: tensor '{t.name}' has dtype {t.dtype}, expected one of {', '.join(sorted(mapping.dtypes))} "
            f"(for parameter {targets})"
        )


def _check_placement(t: TensorInfo, p: Placement, params: dict[str, nn.Parameter]) -> torch.Tensor:
    """The meta slot `params[p.param][p.index]`, after checking that the file tensor fits it exactly."""
    where = f"{t.file}: tensor '{t.name}'"
    if p.param not in params:
        raise CheckpointError(
            f"{where}: unexpected tensor (it would fill parameter '{p.param}', which this model does not have)"
        )
    param = params[p.param]
    try:
        slot = param[p.index] if p.index else param
    except IndexError:
        raise CheckpointError(
            f"{where} maps to index {_fmt_index(p.index)} of parameter '{p.param}' whose shape is "
            f"{list(param.shape)} (index out of range)"
        ) from None
    if p.transform is None:
        if tuple(slot.shape) != t.shape:
            raise CheckpointError(
                f"{where}: shape {list(t.shape)}, expected {list(slot.shape)} (parameter '{p.param}'{_where(p)})"
            )
        return slot
    src = torch.empty(t.shape, dtype=TORCH_DTYPES.get(t.dtype, torch.uint8), device="meta")
    try:
        out_shape = tuple(p.transform(src).shape)
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"{where}: shape {list(t.shape)} does not fit {p.note or 'the transform'}: {e}") from None
    if out_shape != tuple(slot.shape):
        raise CheckpointError(
            f"{where}: shape {list(t.shape)} becomes {list(out_shape)} after {p.note or 'the transform'}, expected "
            f"{list(slot.shape)} (parameter '{p.param}'{_where(p)})"
        )
    return slot


def _check_complete(params, filled: dict[str, int], by_lead: dict[str, dict[int, int]], fmt, source: str) -> None:
    missing = [(n, p) for n, p in params.items() if filled.get(n, 0) != p.numel()]
    if not missing:
        return
    lines = []
    for name, p in missing[:MAX_LISTED]:
        got = filled.get(name, 0)
        state = "absent" if got == 0 else f"only {got} of {p.numel()} elements present"
        if got and name in by_lead:  # slices by leading index (stacked experts): say which are incomplete
            per = p.numel() // p.shape[0]
            gaps = [i for i in range(p.shape[0]) if by_lead[name].get(i, 0) != per]
            shown = ", ".join(map(str, gaps[:MAX_LISTED])) + (", ..." if len(gaps) > MAX_LISTED else "")
            state += f"; incomplete at index [{shown}] of {p.shape[0]}"
        lines.append(
            f"  missing tensor {fmt.source_name(name)}: expected shape {list(p.shape)} for parameter '{name}', "
            f"found {state}"
        )
    more = f"\n  ... and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
    raise CheckpointError(f"{source}: {len(missing)} parameter(s) not in the checkpoint:\n" + "\n".join(lines) + more)
