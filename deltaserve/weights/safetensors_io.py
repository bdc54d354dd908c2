"""Open single or sharded safetensors checkpoints, validating every header before any tensor is read.

Sharded checkpoints are described by `model.safetensors.index.json` (`weight_map`: tensor name -> shard file);
without an index every `*.safetensors` file of the directory is a shard. A header is checked against the file it
belongs to (length, JSON, dtype, shape vs byte span, data inside the file), so a truncated or corrupt shard is
reported by name before loading starts rather than as a crash half-way. Reads go tensor by tensor, each into its
own buffer (see ShardReader): a file is never read into RAM whole.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .formats import TORCH_DTYPES, CheckpointError, TensorInfo

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit

# bytes per element of each safetensors dtype
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip


@dataclass(frozen=True)
class StoredTensor:
    info: TensorInfo
    offset: int  # start of the tensor's bytes inside its file (after the header)


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Parse and validate one shard's header; raises CheckpointError naming the file (and tensor)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header (truncated or empty file)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise CheckpointError(
                f"{path}: header length {n} bytes goes beyond the file size {size} bytes (truncated or corrupt file)"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e}); corrupt file") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header should be a JSON object, found {type(header).__name__}")
    data_start, data_bytes = 8 + n, size - 8 - n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        info, begin = _check_entry(path, name, entry, data_bytes)
        out[name] = StoredTensor(info, data_start + begin)
    return out


def _check_entry(path: Path, name: str, entry: object, data_bytes: int) -> tuple[TensorInfo, int]:
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise CheckpointError(f"{where}: header entry should have dtype, shape and data_offsets, found {entry!r}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise CheckpointError(f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape should be a list of non-negative integers, found {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise CheckpointError(f"{where}: data_offsets should be [begin, end], found {offsets!r}")
    begin, end = offsets
    need = math.prod(shape) * DTYPE_BYTES[dtype]
    if not 0 <= begin <= end or end - begin != need:
        raise CheckpointError(
            f"{where}: data_offsets {offsets} span {end - begin} bytes, expected {need} for {dtype} {shape}"
        )
    if end > data_bytes:
        raise CheckpointError(
            f"{where}: data ends at byte {end} of the data section, but the file holds only {data_bytes} data bytes "
            "(truncated shard)"
        )
    return TensorInfo(name, str(path), tuple(shape), dtype), begin


class SafetensorsCheckpoint:
    """Every tensor of a (sharded) checkpoint, described by validated headers; data read on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.files, self.tensors = _open(self.path)

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    def by_file(self) -> Iterator[tuple[str, list[StoredTensor]]]:
        """(file, its tensors in on-disk order): reading in this order walks each mmap front to back."""
        for file in self.files:
            stored = sorted((s for s in self.tensors.values() if s.info.file == str(file)), key=lambda s: s.offset)
            yield str(file), stored

    def read_file(self, file: str) -> "ShardReader":
        return ShardReader(file)


class ShardReader:
    """Reads single tensors of one shard into freshly allocated (owned) CPU tensors.

    Plain positioned reads rather than a memory map: a mapped file's touched pages count towards the process's
    resident memory until it is unmapped, so mapping a multi-GB shard would add the shard's size to the peak on top
    of the model. Here the only transient memory is the tensor being read.
    """

    def __init__(self, file: str):
        self.file = file

    def __enter__(self) -> "ShardReader":
        self._f = open(self.file, "rb", buffering=0)
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def get(self, stored: StoredTensor) -> torch.Tensor:
        info = stored.info
        nbytes = math.prod(info.shape) * DTYPE_BYTES[info.dtype]
        buf = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(buf.numpy()) if nbytes else memoryview(b"")
        self._f.seek(stored.offset)
        got = self._f.readinto(view) if nbytes else 0
        while got < nbytes:  # readinto may return short counts; a 0 means the file shrank since validation
            n = self._f.readinto(view[got:])
            if not n:
                raise CheckpointError(f"{self.file}: tensor '{info.name}': file ended after {got} of {nbytes} bytes")
            got += n
        return buf.view(TORCH_DTYPES[info.dtype]).reshape(info.shape)


def _open(path: Path) -> tuple[list[Path], dict[str, StoredTensor]]:
    if path.is_file():
        return [path], read_header(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    index = path / INDEX_FILE
    if index.exists():
        return _open_indexed(path, index)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files and no {INDEX_FILE}")
    tensors: dict[str, StoredTensor] = {}
    for file in files:
        for name, stored in read_header(file).items():
            if name in tensors:
                raise CheckpointError(f"{file}: tensor '{name}' is also in {tensors[name].info.file}")
            tensors[name] = stored
    return files, tensors


def _open_indexed(path: Path, index: Path) -> tuple[list[Path], dict[str, StoredTensor]]:
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CheckpointError(f"{index}: not a valid index JSON object ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: 'weight_map' should map tensor names to shard file names")
    shard_names = sorted(set(weight_map.values()))
    for shard in shard_names:
        if not (path / shard).is_file():
            example = next(n for n, s in weight_map.items() if s == shard)
            raise CheckpointError(f"{index}: names shard '{shard}' (e.g. for tensor '{example}'), which does not exist")
    headers = {shard: read_header(path / shard) for shard in shard_names}
    tensors: dict[str, StoredTensor] = {}
    for name, shard in weight_map.items():
        if name not in headers[shard]:
            raise CheckpointError(f"{index}: says tensor '{name}' is in {path / shard}, whose header has no such tensor")
        tensors[name] = headers[shard][name]
    for shard, header in headers.items():
        for name in header:
            if weight_map.get(name) != shard:
                raise CheckpointError(f"{path / shard}: tensor '{name}' is not listed for this shard in {index}")
    return [path / s for s in shard_names], tensors
