"""MLX module paths <-> deltaserve module paths (module = parameter name without ".weight"/".scales"/".biases").

MLX (mlx-lm / mlx-vlm) after conversion, for the nested qwen3_5* models:
  language_model.model.embed_tokens           <-> embed_tokens
  language_model.model.layers.N.<rest>        <-> layers.N.<rest>
  language_model.model.norm                   <-> norm
  language_model.lm_head                      <-> lm_head
  ...mlp.switch_mlp.{gate,up,down}_proj       <-> ...mlp.experts.{gate,up,down}_proj   (stacked [E, out, in])
and for the flat qwen3_next: model.<rest> / lm_head. The MTP head keeps its top-level HF names (`mtp.fc`,
`mtp.layers.0.mlp.switch_mlp.gate_proj`, ...), as `deltaserve quantize` writes it (mlx_lm drops every `mtp.` key
when it loads, so such a checkpoint still loads there). `vision_tower.*` (mlx-vlm) is not ours.
"""

from __future__ import annotations

NESTED = ("language_model.model.", "language_model.lm_head")
FLAT = ("model.", "lm_head")
MTP = "mtp."


def prefixes(model_type: str) -> tuple[str, str]:
    """(body prefix, head module path) of MLX names for this model type."""
    return FLAT if model_type == "qwen3_next" else NESTED


def to_ours(path: str, model_type: str) -> str | None:
    """MLX module or tensor path -> our path (same suffix), or None when it is not part of the language model."""
    body, head = prefixes(model_type)
    if path == head or path.startswith(head + "."):
        rest = "lm_head" + path[len(head):]
    elif path.startswith(MTP):
        rest = path
    elif path.startswith(body):
        rest = path[len(body):]
    else:
        return None
    return rest.replace(".mlp.switch_mlp.", ".mlp.experts.")


def to_mlx(path: str, model_type: str) -> str:
    """Our module or tensor path -> the MLX one."""
    body, head = prefixes(model_type)
    if path == "lm_head" or path.startswith("lm_head."):
        return head + path[len("lm_head"):]
    if path.startswith(MTP):
        return path.replace(".mlp.experts.", ".mlp.switch_mlp.")
    return body + path.replace(".mlp.experts.", ".mlp.switch_mlp.")
