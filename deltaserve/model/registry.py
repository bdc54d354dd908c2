"""Model classes by config.json's `model_type`, the one place that names them: the loader, the quantiser, `info` and
the bench build a model through `build_model(config, ...)`. A new architecture is a module with its causal-LM class
(forward(batch, cache) -> logits, make_cache) and one line here."""

from __future__ import annotations

from torch import nn

from .config import SUPPORTED_MODEL_TYPES, ConfigError, ModelConfig
from .layers import WeightFactory
from .qwen3_5 import Qwen3_5ForCausalLM

# Qwen3.5 (dense), Qwen3.5/3.6 MoE and Qwen3-Next share one network: the config says which layers are sparse and
# how the norms are offset; the class is the same
MODELS: dict[str, type[nn.Module]] = {
    "qwen3_5": Qwen3_5ForCausalLM,
    "qwen3_5_moe": Qwen3_5ForCausalLM,
    "qwen3_next": Qwen3_5ForCausalLM,
}


def model_class(model_type: str) -> type[nn.Module]:
    """The causal-LM class of `model_type`; an unknown type raises a ConfigError naming the supported ones."""
    cls = MODELS.get(model_type)
    if cls is None:
        raise ConfigError(f"no model class for model_type {model_type!r}; deltaserve builds {', '.join(sorted(MODELS))}")
    return cls


def build_model(config: ModelConfig, weights: WeightFactory | None = None, norm_offset: float = 1.0,
                mtp_layers: int = 0) -> nn.Module:
    """config's model with its parameters from `weights` (a checkpoint format's factory; None: dense), not loaded.
    mtp_layers: also the MTP draft head's layers (model/mtp.py; loaded for speculative decoding only)."""
    extra = {"mtp_layers": mtp_layers} if mtp_layers else {}
    return model_class(config.model_type)(config, weights, norm_offset, **extra)


assert set(MODELS) == set(SUPPORTED_MODEL_TYPES), "every supported model_type has a class and no other has one"
