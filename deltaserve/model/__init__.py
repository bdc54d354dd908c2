"""The Qwen3.5/3.6 model family (pure PyTorch reference path). Never imports the engine."""

from .cache import CacheSpec, HybridCache, cache_spec
from .config import ConfigError, ModelConfig
from .forward_batch import ForwardBatch
from .layers import DenseWeights, WeightFactory
from .qwen3_5 import Qwen3_5ForCausalLM

__all__ = [
    "CacheSpec",
    "ConfigError",
    "DenseWeights",
    "ForwardBatch",
    "HybridCache",
    "ModelConfig",
    "Qwen3_5ForCausalLM",
    "WeightFactory",
    "cache_spec",
]
