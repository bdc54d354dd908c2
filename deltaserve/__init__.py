"""deltaserve: fast, exact inference for the Qwen3.5 / Qwen3.6 hybrid models."""

__version__ = "0.1.0"
