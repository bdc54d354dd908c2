"""deltaserve: fast, exact inference for the Qwen3.5 / Qwen3.6 hybrid models.

Public API (everything else is internal):

    from deltaserve import LLM, SamplingParams
    llm = LLM("path/to/checkpoint")
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=32))[0].text

The names are resolved lazily so that `import deltaserve.model` (or the kernels) does not pull in the engine,
tokenizers and jinja2.
"""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name: str):
    if name == "LLM":
        from .engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from .engine.sampling_params import SamplingParams

        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from .engine import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'deltaserve' has no attribute {name!r}")


def __dir__():
    return sorted(__all__ + ["__version__"])
