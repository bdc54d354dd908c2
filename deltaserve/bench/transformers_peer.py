"""The transformers peer: a preset's text model in transformers with random weights made on the device, and its
pp / tg timings (used by `python -m deltaserve.bench.peers transformers`; method in peers.py's docstring).

Nothing here imports torch or transformers at module level, so `peers llama-bench` / `peers table` need neither.
"""

from __future__ import annotations

import sys
import time


def build_transformers_model(preset: str, device: str, dtype, seed: int = 0):
    """The preset's text model in transformers, random weights made on `device` (no CPU copy, no checkpoint)."""
    import importlib

    import torch
    import transformers

    from ..synthetic.presets import get_preset

    cfg = get_preset(preset).config
    text = dict(cfg.get("text_config", cfg))
    moe = cfg["model_type"] == "qwen3_5_moe"
    if cfg["model_type"] not in ("qwen3_5_moe", "qwen3_5"):
        raise ValueError(f"preset {preset}: model_type {cfg['model_type']!r}; the transformers peer runs qwen3_5(_moe)")
    family = "Qwen3_5Moe" if moe else "Qwen3_5"
    module = importlib.import_module(f"transformers.models.{cfg['model_type']}")
    conf_cls = getattr(transformers, f"{family}TextConfig", None) or getattr(module, f"{family}TextConfig")
    model_cls = getattr(transformers, f"{family}ForCausalLM", None) or getattr(module, f"{family}ForCausalLM")
    config = conf_cls(**{k: v for k, v in text.items() if k != "model_type"})
    with torch.device("meta"):
        model = model_cls(config)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _fill(name, p, gen)
        _rebuild_buffers(model, device)
    return model.eval(), config


# The DeltaNet functions transformers' modeling module calls; each is wrapped to dispatch to `fla` /
# `causal_conv1d` when those import, else to the pure-torch function inside the wrapper.
GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update")


def force_torch_kernels(model) -> list[str]:
    """Make the model's modeling module call transformers' own pure-torch DeltaNet functions (fla's Triton kernels
    cannot run on a CPU, and its fused recurrent step crashed on the H200, shared/GPU_NOTES.md). Process-wide for
    that module. Returns the names switched."""
    import inspect

    module = sys.modules[type(model).__module__]
    switched = []
    for name in GDN_FUNCTIONS:
        fn = getattr(module, name, None)
        if fn is not None and inspect.unwrap(fn) is not fn:
            setattr(module, name, inspect.unwrap(fn))
            switched.append(name)
    return switched


def _fill(name: str, p, gen) -> None:
    """In-place random values: zero-centred norms near 0 (applied as 1 + w), the gated norm 1, decays in their
    published range, matrices of std 1/sqrt(fan_in), embedding rows of std 1."""
    if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
        p.fill_(1.0)
    elif name.endswith("A_log"):
        p.uniform_(1.0, 16.0, generator=gen).log_()
    elif "norm" in name:
        p.normal_(0.0, 0.05, generator=gen)
    elif name.endswith("conv1d.weight"):
        p.normal_(0.0, 0.5, generator=gen)
    else:
        p.normal_(0.0, 1.0 if "embed_tokens" in name else p.shape[-1] ** -0.5, generator=gen)


def _rebuild_buffers(model, device) -> None:
    """to_empty leaves buffers (RoPE inv_freq) uninitialised: rebuild each module that owns one from its config."""
    for name, module in list(model.named_modules()):
        if not any(True for _ in module.named_buffers(recurse=False)):
            continue
        if not hasattr(module, "config"):
            raise RuntimeError(f"transformers peer: cannot rebuild buffers of {name} ({type(module).__name__})")
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, type(module)(module.config).to(device))


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class TransformersRunner:
    """pp / tg timings over a transformers model with its DynamicCache (see the module docstring)."""

    def __init__(self, model, device: str, seed: int = 0):
        import inspect

        import torch

        self.model, self.device, self.torch = model, device, torch
        self.vocab = model.config.vocab_size
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.gen = torch.Generator().manual_seed(seed)

    def _ids(self, batch: int, n: int):
        return self.torch.randint(0, self.vocab, (batch, n), generator=self.gen).to(self.device)

    def _forward(self, ids, cache):
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_kw: cache})

    def _fresh(self, batch: int, depth: int):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if depth:
            self._forward(self._ids(batch, depth), cache)  # a real prefill, untimed
        return cache

    def _time(self, setup, run, reps: int) -> list[float]:
        out = []
        with self.torch.inference_mode():
            for i in range(reps + 1):  # the first run is the warm-up
                state = setup()
                _sync(self.device)
                start = time.perf_counter()
                run(state)
                _sync(self.device)
                if i:
                    out.append(time.perf_counter() - start)
        return out

    def prefill(self, n: int, depth: int, batch: int, reps: int) -> list[float]:
        return self._time(lambda: (self._fresh(batch, depth), self._ids(batch, n)),
                          lambda s: self._forward(s[1], s[0]), reps)

    def decode(self, n: int, depth: int, batch: int, reps: int) -> list[float]:
        def run(state):
            cache, ids = state
            for _ in range(n):
                ids = self._forward(ids, cache).logits[:, -1].argmax(-1, keepdim=True)  # greedy feedback

        return self._time(lambda: (self._fresh(batch, depth), self._ids(batch, 1)), run, reps)


def transformers_notes(model, kernels: str) -> str:
    import importlib.util

    import transformers

    if kernels == "torch":
        gdn = "torch functions (forced)"
    else:
        found = [m for m in ("fla", "causal_conv1d") if importlib.util.find_spec(m) is not None]
        gdn = f"transformers' choice ({', '.join(found) or 'no fla/causal_conv1d'} installed)"
    return (f"transformers {transformers.__version__}, attn {model.config._attn_implementation}, experts "
            f"{getattr(model.config, '_experts_implementation', 'n/a')}, DeltaNet {gdn}; random weights; "
            f"depth by real prefill (untimed)")
