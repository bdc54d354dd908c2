"""`deltaserve export-gguf`: write a Qwen3.5/3.6 model as a llama.cpp GGUF file (arch `qwen35moe` / `qwen35`).

    export_gguf("ckpt/", "model-q8_0.gguf", "q8_0")                     # real weights (HF layout checkpoint)
    export_random_gguf("35b-q4km.gguf", preset="qwen3.6-35b-a3b")         # random weights, published shapes

The file is streamed: the header (metadata + every tensor's name, shape, type and offset) is written first, then the
tensors one by one, each converted or generated just before it is written; so a random 20 GB Q4_K_M file needs
about one tensor of memory (the largest: one layer's ffn_{gate,up}_exps, 150 MB). It is written as OUT.partial and
renamed at the end, so a failed export never leaves a file that looks complete.

Types (`--type`): f32 everything F32; f16 / q8_0 matrices in F16 / Q8_0; q4_k_m matrices and the embedding in Q4_K
and the output head in Q6_K. In every type norms, DeltaNet vectors (ssm_a, ssm_dt), conv kernels, routers and the
shared-expert gate stay F32 (as convert_hf_to_gguf.py and llama-quantize keep them). A matrix whose rows do not fill
whole blocks (Q4_K/Q6_K need 256 per row, Q8_0 32) falls back to Q8_0, then F16. Note q4_k_m here is the simple
mix measured in shared/GPU_NOTES.md, not llama-quantize's (which also gives some attn_v / ffn_down layers Q6_K and
attn_qkv Q5_K).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from ..model.config import ModelConfig
from . import blocks
from .layout import F32_ROLES, OUTPUT, ExportError, GGUFTensor, arch_of, gguf_plan
from .metadata import Vocab, read_vocab, write_arch_metadata, write_vocab
from .sources import CheckpointSource, RandomSource

# --type -> (general.file_type, matrix type, output head type)
FILE_TYPES = {
    "f32": (gguf.LlamaFileType.ALL_F32, T.F32, T.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, T.F16, T.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, T.Q8_0, T.Q8_0),
    "q4_k_m": (gguf.LlamaFileType.MOSTLY_Q4_K_M, T.Q4_K, T.Q6_K),
}


@dataclass
class ExportReport:
    path: Path
    arch: str
    file_type: str
    bytes: int
    params: int
    seconds: float
    types: Counter = field(default_factory=Counter)  # GGUF type name -> tensor count

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.types.items()))
        size = f"{self.bytes / 2**30:.2f} GiB" if self.bytes >= 2**30 else f"{self.bytes / 2**20:.2f} MiB"
        params = f"{self.params / 1e9:.2f} B" if self.params >= 1e9 else f"{self.params / 1e6:.2f} M"
        return (f"wrote {self.path}: {self.arch} {self.file_type}, {params} parameters, {size} ({kinds}) "
                f"in {self.seconds:.1f} s")


def tensor_type(file_type: str, t: GGUFTensor) -> T:
    """The stored type of one tensor under --type file_type (see the module docstring)."""
    if file_type not in FILE_TYPES:
        raise ExportError(f"unknown GGUF type {file_type!r}; choose one of {', '.join(FILE_TYPES)}")
    if t.role in F32_ROLES:
        return T.F32
    _, matrix, output = FILE_TYPES[file_type]
    want = output if t.role == OUTPUT else matrix
    if want in (T.F32, T.F16):
        return want
    for candidate in (want, T.Q8_0):
        if t.shape[-1] % blocks.BLOCK[candidate][0] == 0:
            return candidate
    return T.F16


def export_gguf(model_dir: str | Path, out: str | Path, file_type: str = "f16", fuse_gate_up: bool = False,
                progress: bool = True) -> ExportReport:
    """Export an unquantised (Hugging Face layout) checkpoint directory. Loads the checkpoint in its own float
    dtype first (memory: about the checkpoint's size), then converts and writes tensor by tensor."""
    from ..weights.loader import load_checkpoint  # lazy: the random mode needs no checkpoint machinery

    model_dir = Path(model_dir)
    config = ModelConfig.from_dir(model_dir)
    arch_of(config)  # unsupported model types fail before any weight is read
    vocab = read_vocab(model_dir, config)
    loaded = load_checkpoint(model_dir, progress=progress, mtp=False)  # llama.cpp files here carry no MTP head
    if loaded.format != "hf":
        raise ExportError(f"{model_dir}: export-gguf reads unquantised checkpoints (Hugging Face layout); this one "
                          f"is {loaded.format!r}. Export its bf16 original instead")
    params = dict(loaded.model.named_parameters())
    source = CheckpointSource(params, str(model_dir))
    plan = gguf_plan(config, fuse_gate_up)
    return write_gguf(out, config, vocab, plan, file_type, source, model_dir.name, progress)


def export_random_gguf(out: str | Path, preset: str | None = None, model_dir: str | Path | None = None,
                       file_type: str = "q4_k_m", seed: int = 0, fuse_gate_up: bool = False,
                       progress: bool = True) -> ExportReport:
    """A GGUF file of the shapes of `preset` (synthetic presets: the published configs) or of `model_dir`'s
    config.json (+ its tokenizer), with random but valid weights of every stored type."""
    if (preset is None) == (model_dir is None):
        raise ExportError("give exactly one of a preset name or a model directory for a random export")
    if preset is not None:
        from ..synthetic.presets import get_preset
        from ..synthetic.tokenizer import write_tokenizer_files

        p = get_preset(preset)
        config = ModelConfig.from_dict(p.config, source=f"preset {p.name}")
        arch_of(config)
        with tempfile.TemporaryDirectory() as tmp:  # the preset's tokenizer, read back like a checkpoint's
            write_tokenizer_files(tmp, p)
            vocab = read_vocab(tmp, config)
        name = p.name
    else:
        config = ModelConfig.from_dir(model_dir)
        vocab = read_vocab(model_dir, config)
        name = Path(model_dir).name
    plan = gguf_plan(config, fuse_gate_up)
    return write_gguf(out, config, vocab, plan, file_type, RandomSource(seed), f"{name} (random weights)", progress)


def write_gguf(out: str | Path, config: ModelConfig, vocab: Vocab, plan: list[GGUFTensor], file_type: str,
               source, name: str, progress: bool = True) -> ExportReport:
    start = time.perf_counter()
    out = Path(out)
    arch = arch_of(config)
    types = [tensor_type(file_type, t) for t in plan]
    source.check(plan)
    partial = out.with_name(out.name + ".partial")
    w = gguf.GGUFWriter(partial, arch)
    w.add_name(name)
    w.add_file_type(int(FILE_TYPES[file_type][0]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_arch_metadata(w, config)
    write_vocab(w, vocab)
    sizes = [blocks.nbytes(q, t.shape) for t, q in zip(plan, types)]
    for t, q, size in zip(plan, types, sizes):
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), size, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    bar = _bar(sum(sizes), out.name, progress)
    try:
        for t, q, size in zip(plan, types, sizes):
            data = source.data(t, q)
            if data.nbytes != size:  # a source bug; caught here rather than as a corrupt file
                raise ExportError(
                    f"{t.name}: {data.nbytes} bytes produced for {q.name} {list(t.shape)}, expected {size}"
                )
            w.write_tensor_data(data)
            bar.update(size)
        w.close()
    except BaseException:
        w.close()
        partial.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    partial.replace(out)
    params = sum(t.numel for t in plan)
    return ExportReport(out, arch, file_type, out.stat().st_size, params, time.perf_counter() - start,
                        Counter(q.name for q in types))


def _bar(total: int, name: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"writing {name}", unit="B", unit_scale=True, disable=not enabled)
