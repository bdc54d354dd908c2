"""Export to other engines' formats: llama.cpp GGUF (`qwen35moe` / `qwen35`), for peer benchmarks and outside
checks of our model against llama.cpp.

    from deltaserve.export import export_gguf, export_random_gguf
    export_gguf("ckpt/", "model-f32.gguf", "f32")
    export_random_gguf("35b-q4_k_m.gguf", preset="qwen3.6-35b-a3b", file_type="q4_k_m")
"""

from .layout import ExportError, GGUFTensor, gguf_plan, tile_v_heads
from .writer import FILE_TYPES, ExportReport, export_gguf, export_random_gguf, tensor_type

__all__ = [
    "FILE_TYPES",
    "ExportError",
    "ExportReport",
    "GGUFTensor",
    "export_gguf",
    "export_random_gguf",
    "gguf_plan",
    "tensor_type",
    "tile_v_heads",
]
