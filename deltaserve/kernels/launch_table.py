"""The kernels' tuned launch constants as data, keyed by GPU and by weight shape, never by batch size.

`launch_tables/default.json` declares every constant: its value, its shape-keyed values where one shape was tuned
apart, and one line saying what it is and what it won against (most were measured on the H200: lab/NOTES.md). A GPU
whose name has a file of its own (`launch_tables/<name>.json`, the name as torch.cuda.get_device_name gives it with
every run of other characters than letters and digits made one '_', e.g. NVIDIA_H100_80GB_HBM3.json) overrides
values or shape entries of the default there, and only constants the default declares. The kernels' host code asks
for a constant by name when it launches (`value(name, **shape)`), like vLLM's fused-MoE config files: the table is the
CUDA device's the process first asks on, bound once (a deployment's processes each drive GPUs of one kind; on a
machine without a GPU: the default), so a lookup is a dictionary read, not a device query (it runs at every eager
launch).

Shape keys name weight dimensions only (SHAPE_FIELDS: K, N, H, I, E, D, bits, group), so no choice here can follow
the number of rows in a launch: a row's bits never depend on its batch. A key "K=4096" matches a launch whose K is
4096; "K=4096,bits=4" needs both; of the keys that match, the one naming the most fields wins (two that tie are
refused when the table is read). Thresholds on row counts (e.g. from how many rows a launch takes the warpgroup
kernel) are values, and every kernel they choose between gives a row the same bits (the GPU batch-invariance tests).

`override({...})` sets values for the length of a `with` (tests and the lab's sweeps); a table's values are
otherwise frozen. The plan (model/plan.py) names the table a deployment runs on (`deltaserve info --plan`, every
bench record's notes). docs/launch_table.md is generated from the default: `python -m deltaserve.kernels.launch_table
> docs/launch_table.md` (a test checks it is current).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

TABLES = Path(__file__).with_name("launch_tables")
DEFAULT_FILE = "default.json"
SHAPE_FIELDS = ("K", "N", "H", "I", "E", "D", "bits", "group")
_SHAPE_SET = frozenset(SHAPE_FIELDS)

_OVERRIDES: dict[str, object] = {}
_bound: "LaunchTable | None" = None  # the process's table, bound at the first lookup (table())


def _frozen(value):
    """JSON lists as tuples (a constant's value is hashable and never mutated)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _parse_shape(key: str, where: str) -> tuple[tuple[str, int], ...]:
    """'K=4096,bits=4' -> (('K', 4096), ('bits', 4)); a bad key raises a ValueError naming `where`."""
    fields = []
    for part in key.split(","):
        name, eq, raw = part.strip().partition("=")
        if not eq or name not in SHAPE_FIELDS or not raw.strip().lstrip("-").isdigit():
            raise ValueError(f"{where}: shape key {key!r} must be NAME=INT pairs joined by ',' with NAME one of "
                             f"{', '.join(SHAPE_FIELDS)} (weight dimensions: never a row count)")
        fields.append((name, int(raw)))
    if len({n for n, _ in fields}) != len(fields):
        raise ValueError(f"{where}: shape key {key!r} names a field twice")
    return tuple(sorted(fields))


@dataclass(frozen=True)
class Constant:
    """One tuned constant: its value, values for shapes tuned apart ((fields, value), the most specific first), and
    its documentation line."""

    name: str
    value: object
    doc: str
    shapes: tuple[tuple[tuple[tuple[str, int], ...], object], ...] = ()

    def at(self, shape: Mapping[str, int]) -> object:
        for fields, v in self.shapes:
            for n, want in fields:
                if shape.get(n) != want:
                    break
            else:
                return v
        return self.value


@dataclass(frozen=True)
class LaunchTable:
    """The constants of one GPU: the default table with that GPU's file laid over it (`files`: those read)."""

    gpu: str | None
    files: tuple[str, ...]
    constants: Mapping[str, Constant] = field(repr=False)

    @property
    def name(self) -> str:
        """'default' or 'default+<gpu file stem>' (the plan's and the records' name for it)."""
        return "+".join(Path(f).stem for f in self.files)

    def get(self, name: str, **shape: int) -> object:
        const = self.constants.get(name)
        if const is None:
            raise KeyError(f"{name!r} is not a launch constant of {TABLES / DEFAULT_FILE}")
        if not shape:
            return const.value if not const.shapes else const.at(shape)
        if not shape.keys() <= _SHAPE_SET:
            raise ValueError(f"launch constant {name}: shape fields {sorted(set(shape) - _SHAPE_SET)} are not weight "
                             f"dimensions ({', '.join(SHAPE_FIELDS)})")
        return const.at(shape)


def gpu_file_stem(gpu: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3' (the file a GPU's own values live in)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", gpu).strip("_")


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"launch table {path}: cannot be read as JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("constants"), dict):
        raise ValueError(f"launch table {path}: expected an object with a 'constants' object")
    return data


def _shape_entries(raw: object, where: str) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: 'shapes' must be an object of shape key -> value, found {type(raw).__name__}")
    return {_parse_shape(k, where): _frozen(v) for k, v in raw.items()}


def _ordered(entries: dict, where: str) -> tuple:
    """Shape entries, the most specific first; two keys of as many fields that could match one shape are refused."""
    keys = list(entries)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            da, db = dict(a), dict(b)
            if len(a) == len(b) and all(da[n] == db[n] for n in set(da) & set(db)):
                raise ValueError(f"{where}: shape keys {a} and {b} tie for a shape that matches both")
    return tuple(sorted(entries.items(), key=lambda kv: -len(kv[0])))


def _same_kind(a: object, b: object) -> bool:
    if a is None or b is None:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return True
    return type(a) is type(b)


def load(gpu: str | None, tables: Path = TABLES) -> LaunchTable:
    """The table of GPU `gpu` (None: the default alone) from the files under `tables`. A malformed file, a constant
    a GPU file adds, or a value of another type than the default's raises a ValueError naming file and constant."""
    path = tables / DEFAULT_FILE
    base = _read(path)
    consts: dict[str, Constant] = {}
    for name, entry in base["constants"].items():
        where = f"launch table {path}, constant {name}"
        if not isinstance(entry, dict) or "value" not in entry or not str(entry.get("doc", "")).strip():
            raise ValueError(f"{where}: expected an object with 'value' and a non-empty 'doc'")
        shapes = _shape_entries(entry.get("shapes", {}), where)
        for v in shapes.values():
            if not _same_kind(v, _frozen(entry["value"])):
                raise ValueError(f"{where}: a shape value {v!r} is not of the value's type")
        consts[name] = Constant(name, _frozen(entry["value"]), entry["doc"], _ordered(shapes, where))
    files = [path.name]
    own = tables / f"{gpu_file_stem(gpu)}.json" if gpu else None
    if own is not None and own.exists():
        data = _read(own)
        for name, entry in data["constants"].items():
            where = f"launch table {own}, constant {name}"
            if name not in consts:
                raise ValueError(f"{where}: not declared in {path.name} (a GPU file only overrides)")
            if not isinstance(entry, dict) or not set(entry) <= {"value", "shapes", "doc"}:
                raise ValueError(f"{where}: expected an object of 'value' and/or 'shapes' (and 'doc')")
            const = consts[name]
            value = _frozen(entry.get("value", const.value))
            if not _same_kind(value, const.value):
                raise ValueError(f"{where}: value {value!r} is not of the default's type ({const.value!r})")
            shapes = dict(const.shapes)
            shapes.update(_shape_entries(entry.get("shapes", {}), where))
            consts[name] = Constant(name, value, const.doc, _ordered(shapes, where))
        files.append(own.name)
    return LaunchTable(gpu, tuple(files), consts)


@functools.cache
def _table_of(gpu: str | None) -> LaunchTable:
    return load(gpu)


@functools.cache
def _gpu_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def current_gpu() -> str | None:
    """The current CUDA device's name, or None on a machine without one (whose kernels run in the interpreter)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return _gpu_name(torch.cuda.current_device())


def table(gpu: str | None = None) -> LaunchTable:
    """GPU `gpu`'s table, or (None) the process's: the current CUDA device's at the first call, bound from then on."""
    global _bound
    if gpu is not None:
        return _table_of(gpu)
    if _bound is None:
        _bound = _table_of(current_gpu())
    return _bound


def value(name: str, **shape: int) -> object:
    """Launch constant `name` for a weight of `shape` (SHAPE_FIELDS) in the process's table (or its override)."""
    if _OVERRIDES and name in _OVERRIDES:
        return _OVERRIDES[name]
    return (_bound or table()).get(name, **shape)


@contextlib.contextmanager
def override(values: Mapping[str, object]) -> Iterator[None]:
    """Set launch constants by name for the length of the block (tests, the lab's sweeps); unknown names raise."""
    known = _table_of(None).constants
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise KeyError(f"not launch constants of {TABLES / DEFAULT_FILE}: {unknown}")
    saved = dict(_OVERRIDES)
    _OVERRIDES.update(values)
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _OVERRIDES.update(saved)


def markdown() -> str:
    """docs/launch_table.md: one row per constant of the default table, and the GPU files there are."""
    tab = load(None)
    gpus = sorted(p.name for p in TABLES.glob("*.json") if p.name != DEFAULT_FILE)
    lines = [
        "# Launch constants",
        "",
        "Generated from `deltaserve/kernels/launch_tables/default.json` (`python -m deltaserve.kernels.launch_table "
        "> docs/launch_table.md`);",
        "do not edit by hand. The kernels' tuned launch shapes, keyed by GPU (a file per GPU overrides the default: "
        + (", ".join(f"`{g}`" for g in gpus) if gpus else "none yet") + ")",
        "and by weight shape (never by batch size). See `deltaserve/kernels/launch_table.py`.",
        "",
        "| constant | value | by shape | what it is |",
        "|---|---|---|---|",
    ]
    for c in tab.constants.values():
        shapes = "; ".join(",".join(f"{n}={v}" for n, v in k) + f": `{json.dumps(val)}`" for k, val in c.shapes)
        lines.append(f"| `{c.name}` | `{json.dumps(c.value)}` | {shapes} | {c.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
