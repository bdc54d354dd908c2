"""The GPU fast path's seam: when it runs, and how a weight-holding module is handed to the Triton kernels.

The model's modules keep one forward each; where the fast path differs (batched kernels reading device-side metadata
instead of per-sequence loops) they branch on `enabled(x)`. Everything on the fast path reads only device tensors
and host sizes fixed by the batch shape, so a decode step can be captured in a CUDA graph.

Weight modules are read by duck typing (the model may not import `quant`): a module with `scales`/`biases` and a
`spec` (bits, group_size) is affine-packed; one with only `weight` is dense.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
from torch import nn

from ..kernels import backend
from ..utils import tuning
from .plan import KernelPlan


def enabled(x: torch.Tensor) -> bool:
    """Run the Triton kernels for this activation? A bf16/fp16 tensor on CUDA (reference path not forced), or on
    CPU under Triton's interpreter (TRITON_INTERPRET=1 with DELTASERVE_FAST_INTERPRET=1: debugging without a GPU)."""
    if backend.reference_enabled() or x.dtype not in (torch.bfloat16, torch.float16):
        return False  # the kernels take 16-bit activations; an fp32 model on the GPU runs the reference ops
    if x.is_cuda:
        return True
    return backend.interpreting() and tuning.get("DELTASERVE_FAST_INTERPRET")


@dataclass(eq=False)
class FastState:
    """What the fast path keeps for one module, in one record (`state(module)`): the kernel plan its deployment fixed
    (set_plan), whether it makes the logits (mark_output_head), and what the kernels derive from its weights on
    first use (weights never move after loading): its WeightSpecs by attribute, an expert bank's stacked specs, the
    tensor-core GEMV's repacked copy (a linear) or repacked experts (an MoE block), the prefill's natural-order
    copy, a router's bf16 codes, and, on an expert bank, that its MLX tensors were released after the repack.
    None: not built yet; (): built, and the module cannot take that path."""

    plan: KernelPlan | None = None
    output_head: bool = False
    specs: dict = field(default_factory=dict)
    stacked: tuple | None = None
    mma: object = None
    dense: tuple | None = None
    router_codes: object = None
    released: bool = False

    def copies(self):
        """The tensors of the copies built so far (decode_copy_bytes)."""
        yield from _tensors(self.mma or ())
        yield from _tensors(self.router_codes if isinstance(self.router_codes, torch.Tensor) else ())
        yield from _tensors(self.dense or ())


STATE_ATTR = "_fast_state"  # the one key the fast path keeps in a module's __dict__ (not a submodule, no state_dict)


def state(module: nn.Module) -> FastState:
    """`module`'s FastState (made empty on first ask)."""
    st = module.__dict__.get(STATE_ATTR)
    if st is None:
        st = module.__dict__[STATE_ATTR] = FastState()
    return st


def weight_spec(module: nn.Module, attr: str = "weight"):
    """The module's weight as the kernels read it (kept in its FastState; weights never move after loading)."""
    from ..kernels.triton_common import WeightSpec

    specs = state(module).specs
    spec = specs.get(attr)
    if spec is None:
        w = getattr(module, attr)
        if hasattr(module, "scales"):
            q = module.spec
            spec = WeightSpec(w, module.scales, module.biases, q.bits, q.group_size, attr)
        else:
            spec = WeightSpec.dense(w, attr)
        specs[attr] = spec
    return spec


def embed(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """module(ids), the token embedding. On the fast path a packed affine table (bits 2, 4, 8) is looked up by one
    kernel (kernels/quant/triton_embed: the same bits as the module's gather, which is ~13 torch launches), launched
    without PDL: the forward's first kernel."""
    scales = getattr(module, "scales", None)
    if scales is None or not hasattr(module, "spec") or not enabled(scales):
        return module(ids)
    from ..kernels.quant.triton_embed import affine_embed, embed_supported

    q = module.spec
    if not embed_supported(q.bits, q.group_size, scales.shape[1] * q.group_size):
        return module(ids)
    return affine_embed(module.weight, scales, module.biases, ids, q.bits, q.group_size)


def stacked_specs(experts: nn.Module):
    """(gate, up, down) WeightSpecs of a routed-expert bank: the fused dense `Experts` ([E, 2I, H] split into two
    views) or a `StackedExperts` of three stacked projections."""
    from ..kernels.triton_common import WeightSpec

    st = state(experts)
    cached = st.stacked
    if cached is None:
        if st.released:
            raise RuntimeError("these experts were repacked for the tensor-core MoE (moe_kernels='mma') and their MLX "
                               "tensors released; only that path can run them")
        if hasattr(experts, "gate_up_proj"):
            i = experts.intermediate
            gu = experts.gate_up_proj
            cached = (WeightSpec.dense(gu[:, :i]), WeightSpec.dense(gu[:, i:]), WeightSpec.dense(experts.down_proj))
        else:
            cached = tuple(weight_spec(p) for p in (experts.gate_proj, experts.up_proj, experts.down_proj))
        st.stacked = cached
    return cached


WIDE_ROWS = 8192  # "wide": the tensor-core GEMV for weights of at least this many output rows
DEFAULT_PLAN = KernelPlan()


def all_modules(model: nn.Module):
    """Every module of the tree, with the ones kept in a module's __dict__ (fused projections: model/fusion.py)."""
    for m in model.modules():
        yield m
        yield from (v for v in m.__dict__.values() if isinstance(v, nn.Module))


def set_plan(model: nn.Module, plan: KernelPlan) -> None:
    """Fix `model`'s kernel plan (an engine does this once, before its first step and its graph captures)."""
    for m in all_modules(model):
        state(m).plan = plan


def plan_of(module: nn.Module | None) -> KernelPlan:
    """The plan `module`'s deployment fixed, or DEFAULT_PLAN (the batch-1 GEMVs, the tensor-core MoE)."""
    st = None if module is None else module.__dict__.get(STATE_ATTR)
    return (None if st is None else st.plan) or DEFAULT_PLAN


def set_decode_gemv(model: nn.Module, mode: str) -> None:
    """Fix the decode GEMV mode of `model`'s plan (one of DECODE_GEMV_MODES), keeping its other choices."""
    set_plan(model, replace(plan_of(model), decode_gemv=mode))


def decode_gemv(module: nn.Module | None = None) -> str:
    """Which GEMV serves a decode step's q4 g64 linears (KernelPlan.decode_gemv): the mode `module`'s deployment
    fixed, else "head". The choice is per weight, never per batch size, so a row's bits never depend on the batch.
    "head" is the batch-1 mode: on the H200 (Qwen3.6-35B-A3B q4, tg128 @ d512) it gave 600.4 tok/s at batch 1
    (cuda 594.0) for a 0.27 GiB copy of the lm_head; "mma" wins from 2 streams on (lab/NOTES.md)."""
    return plan_of(module).decode_gemv


def throughput_deployment(module: nn.Module | None = None) -> bool:
    """Whether `module`'s deployment is a throughput one (decode_gemv "mma": 4+ streams), whose other per-deployment
    launch shapes (the DeltaNet step's state columns, the decode attention merge) follow it."""
    return plan_of(module).throughput


def mark_output_head(module: nn.Module | None) -> None:
    """Mark the module whose linear makes the logits (the lm_head, or the tied embedding table), which the "head"
    decode GEMV mode serves with the tensor-core GEMV."""
    if module is not None:
        state(module).output_head = True


def mma_weights(module: nn.Module, x: torch.Tensor):
    """(words, sb) of `module`'s weight in the tensor-core GEMV's layout when that GEMV serves its decode steps
    (decode_gemv(module) == "mma", or "wide" / "head" and the weight is one they pick; a 2-D q4 g64 weight with
    N % 16 == 0 on CUDA), else None. Built on first use and cached on the module: weights never move after loading
    (the copy is what `decode_copy_bytes` counts)."""
    mode = decode_gemv(module)
    if mode == "cuda" or not x.is_cuda or not hasattr(module, "scales"):
        return None
    if mode == "wide" and weight_spec(module).n < WIDE_ROWS:
        return None
    st = state(module)
    if mode == "head" and not st.output_head:
        return None
    cached = st.mma
    if cached is None:
        from ..kernels.quant import mma_gemv

        s = weight_spec(module)
        eligible = (mma_gemv.HAVE_GLUON and s.bits == 4 and s.group == mma_gemv.GROUP and s.w.dim() == 2
                    and s.n % mma_gemv.ROW_BLOCK == 0 and s.k % mma_gemv.GROUP == 0)
        cached = mma_gemv.repack_q4(s.w, s.scales, s.biases) if eligible else ()
        st.mma = cached
    return cached or None


def prefill_dense_weights(module: nn.Module, x: torch.Tensor):
    """(words, sb, bf16_fma) of `module`'s weight repacked in the natural order (mma_gemv.repack_q4(order="natural"))
    and whether its values allow the bf16x2-fma dequantisation (wgmma_dense.bf16_fma_exact), when the
    prefill's m rows of x take the dequantising warpgroup-MMA matmul (triton_affine.dense_path(m) == "fused" and
    wgmma_dense.enough_programs; a q4 g64 2-D weight with N % 64 == 0 on CUDA, x bf16), else None. Built on first use and
    cached on the module (weights never move after loading); counted by decode_copy_bytes."""
    from ..kernels.quant import mma_gemv
    from ..kernels.quant.triton_affine import dense_path
    from ..kernels.quant.wgmma_dense import bf16_fma_exact, dense_fits, enough_programs

    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not x.is_cuda or x.dtype != torch.bfloat16 or not hasattr(module, "scales") or dense_path(m) != "fused":
        return None
    s = weight_spec(module)
    if not enough_programs(m, s.n):  # too few programs to fill the GPU: dequantise + multiply
        return None
    st = state(module)
    cached = st.dense
    if cached is None:
        cached = ()
        if s.w.dim() == 2 and dense_fits(s.n, s.k, s.bits, s.group):
            words, sb = mma_gemv.repack_q4(s.w, s.scales, s.biases, order="natural")
            cached = (words, sb, bf16_fma_exact(sb))
        st.dense = cached
    return cached or None


def router_codes(module: nn.Module) -> torch.Tensor | None:
    """The MoE router `module`'s codes as bf16 [E, K] for the tensor-core prefill router where its codes are read
    from a copy (kernels/moe/triton_router_mma: the same bits as unpacking the words, 13.9 against 20.2 us at 512
    tokens on the H200), else None. Built on first use and cached on the module (weights never move after loading); counted by
    decode_copy_bytes."""
    from ..kernels.moe.triton_router_mma import router_codes_bf16

    if not hasattr(module, "scales"):
        return None
    st = state(module)
    cached = st.router_codes
    if cached is None:
        s = weight_spec(module)
        cached = router_codes_bf16(s) if s.bits in (4, 8) and s.w.dim() == 2 else ()
        st.router_codes = cached
    return cached if isinstance(cached, torch.Tensor) else None


def moe_kernels(module: nn.Module | None = None) -> str:
    """Which kernels serve `module`'s MoE blocks on the GPU (KernelPlan.moe, its deployment's): "mma" (one
    tensor-core kernel family for every token count, kernels/moe/mma_moe.py, on the experts repacked once in MMA
    fragment order; the MLX copy of the routed experts is released, so the weights stay one copy) or "cuda" (the
    CUDA-core decode kernels for decode steps and short prefills, the grouped wgmma matmul for longer prefills, on
    the MLX q4 layout). "mma" by default: on the H200 (Qwen3.6-35B-A3B q4 g64, tg @ d512, lab/NOTES.md) pp512
    15,753 tok/s (cuda 10,239), 2,441 at 64 streams (1,770), 641.8 at batch 1 (650.6: -1.4%). Blocks the
    tensor-core MoE cannot take (not q4 g64, widths not multiples of 64, no Gluon) run the CUDA-core kernels."""
    return plan_of(module).moe


def mma_moe_weights(block: nn.Module, x: torch.Tensor):
    """The MoE block's experts as kernels/moe/mma_moe.MmaExperts when moe_kernels() == "mma" and the routed experts
    are q4 g64 (stacked affine, I and H multiples of 64) on CUDA, else None. Built on first use: the routed experts
    are repacked (the shared expert stacked last when it has their width), then their MLX tensors are released,
    so every later forward of this block must take this path (stacked_specs refuses them)."""
    if moe_kernels(block) != "mma" or not x.is_cuda:
        return None
    st = state(block)
    cached = st.mma
    if cached is None:
        from ..kernels.moe.mma_moe import pack_mma_experts
        from ..kernels.quant import mma_gemv

        experts = block.experts
        specs = stacked_specs(experts) if hasattr(experts, "gate_proj") else ()
        eligible = mma_gemv.HAVE_GLUON and len(specs) == 3 and all(
            s.bits == 4 and s.group == mma_gemv.GROUP and s.w.dim() == 3 and s.n % 64 == 0 and s.k % 64 == 0
            for s in specs)
        if not eligible:
            st.mma = ()
            return None
        se = block.shared_expert
        shared = [weight_spec(p) for p in (se.gate_proj, se.up_proj, se.down_proj)] if se is not None else []
        cached = pack_mma_experts(*specs, *shared)
        st.mma = cached
        for proj in (experts.gate_proj, experts.up_proj, experts.down_proj):  # one copy of the weights
            state(proj).specs.pop("weight", None)
            for name in ("weight", "scales", "biases"):
                t = getattr(proj, name)
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        bank = state(experts)
        bank.stacked, bank.released = None, True
    return cached or None


MOE_PREP = (4, 64)  # the tensor-core MoE's prep format: the group sums of x over groups of 64


def moe_prep(block: nn.Module, x: torch.Tensor) -> tuple[int, int] | None:
    """MOE_PREP when `block` is an MoE block on the tensor-core path, whose kernels read its input's group sums
    (the norm before it can make them: kernels/triton_norm.add_rms_norm(prep=), the same bits as a prep launch),
    else None."""
    from ..kernels.triton_norm import prep_supported

    if not enabled(x) or not hasattr(block, "experts") or mma_moe_weights(block, x) is None:
        return None
    return MOE_PREP if prep_supported(x.shape[-1], *MOE_PREP) else None


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)


def decode_copy_bytes(model: nn.Module) -> int:
    """Bytes held by the tensor-core kernels' repacked weights built so far: the GEMV copies (fused projections
    included), the MoE experts (which replace their MLX tensors instead of copying them), the routers' bf16
    codes (router_codes) and the prefill's natural-order copies (prefill_dense_weights)."""
    seen, total = set(), 0
    for obj in all_modules(model):
        st = obj.__dict__.get(STATE_ATTR)
        for t in (() if st is None else st.copies()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def conv_in_gemv(pool: torch.Tensor, x: torch.Tensor) -> bool:
    """Run the DeltaNet decode conv in the input projection's GEMV epilogue (one launch fewer per layer)? Either
    decode GEMV has the epilogue (triton_gemv's and mma_gemv's, each equal to its GEMV followed by the conv kernel
    bit for bit); it needs a conv pool in the activation dtype."""
    return pool.dtype == x.dtype


class GemvPrep(NamedTuple):
    """A decode GEMV's prep of its input rows, made by the kernel that wrote those rows (the norm, the DeltaNet step,
    the attention merge) with the prep kernel's arithmetic, handed to the GEMV explicitly (`linear(prep=)`), which
    then skips its prep launch. fmt: the (bits, group) weight format it was made for; parts: (xp [R, K] fp32 or
    unused, xs [R, K / group] fp32), row r for row r."""

    fmt: tuple
    parts: tuple

    def for_format(self, fmt: tuple) -> tuple | None:
        """(xp, xs) when made for weight format fmt, else None (the consumer makes its own)."""
        return self.parts if self.fmt == fmt else None

    def rows(self, lo: int, hi: int) -> "GemvPrep":
        """The prep of rows lo .. hi-1 (a half of a decode step: mixer_decode)."""
        return GemvPrep(self.fmt, tuple(p[lo:hi] if isinstance(p, torch.Tensor) and p.dim() else p
                                        for p in self.parts))


def prep_rows(prep: GemvPrep | None, lo: int, hi: int) -> GemvPrep | None:
    return None if prep is None else prep.rows(lo, hi)


def norm_for_gemv(norm: nn.Module, x: torch.Tensor, consumer: nn.Module | None,
                  decode: bool) -> tuple[torch.Tensor, GemvPrep | None]:
    """(norm(x), its prep or None), norm an RMSNorm module, on the fast path. When the output feeds `consumer`'s
    decode GEMV through the prep path (a packed weight: triton_gemv.use_inline_prep), the norm kernel also writes
    that GEMV's prep of its rows (the prep kernel's code on the same values: the same bits), which the caller hands
    to the consumer's `linear(prep=)` to skip the prep launch. Any other case: (plain norm(x), None)."""
    if consumer is None or not decode or not enabled(x) or not hasattr(consumer, "scales"):
        return norm(x), None
    from ..kernels.quant.triton_gemv import use_inline_prep
    from ..kernels.triton_norm import prep_supported, rms_norm

    s = weight_spec(consumer)
    n = norm.weight.numel()
    if use_inline_prep(s, None) or s.k != n or not prep_supported(n, s.bits, s.group):
        return norm(x), None
    y, made = rms_norm(x, norm.weight, norm.eps, norm.offset, prep=(s.bits, s.group))
    return y, GemvPrep((s.bits, s.group), made)


def _splits_at(least: int, rows: int, x: torch.Tensor) -> bool:
    """Whether a decode step of `rows` rows reaches `least`, the fewest rows that split in two (0: never; one row
    has no two parts), on the fast path: mixer_halves' and moe_fork's threshold."""
    return bool(least) and rows >= max(least, 2) and enabled(x)


MIXER_HALVES_ROWS = 48  # decode rows from which a mixer runs as two halves on two streams (mixer_halves)
MIXER_HALVES_ATTN = True  # whether the attention layers' mixers do too


def mixer_halves(rows: int, x: torch.Tensor, kind: str = "deltanet") -> bool:
    """Whether a decode step of `rows` rows runs each mixer of `kind` ("deltanet": the in-projection with its conv,
    the step, the out projection; "attention": the projection, the q/k prep, the decode attention, o_proj) as two
    halves of the rows, each on a stream of its own (run_halves). Every launch is batch invariant, so the halves
    give the bits of one launch over all rows; what changes is how the launches share the SMs. H100 probe, 30
    DeltaNet layers at the 35B-A3B's shapes (lab/probe_overlap.py, lab/NOTES.md): 64 rows 157.2 -> 143.1 us
    a layer (-9%), 32 rows 82.2 -> 81.4. In the model, H100, 64 streams tg64 @ d512: none 5,065 / 5,065,
    DeltaNet layers 5,146 / 5,147 (+1.6%), attention layers too 5,186 / 5,194 (+2.5%).
    Off CUDA the halves run one after the other (the same code path, for the CPU tests)."""
    if kind not in ("deltanet", "attention"):
        raise ValueError(f"mixer_halves: kind 'deltanet' or 'attention', found {kind!r}")
    if kind == "attention" and not MIXER_HALVES_ATTN:
        return False
    return _splits_at(MIXER_HALVES_ROWS, rows, x)


_SIDE_STREAMS: dict[int, tuple] = {}  # device index -> the two side streams (made once, outside any capture)


def run_forked(fns, device: torch.device) -> None:
    """The two callables in fns, each on a side stream forked from the current one and joined back into it before
    this returns (a captured graph gets the two branches), under arrival-counter lanes 1 and 2
    (kernels/triton_sync.counter_lane: the two branches' launches may run at once). Off CUDA, or inside a capture
    before the streams exist, one after the other on the current stream, with the same lanes."""
    from ..kernels.triton_sync import counter_lane

    if len(fns) != 2:
        raise ValueError(f"run_forked: two branches (the two side streams), found {len(fns)}")
    cur = torch.cuda.current_stream(device) if device.type == "cuda" else None
    streams = None
    if cur is not None:
        index = cur.device.index
        streams = _SIDE_STREAMS.get(index)
        if streams is None and not torch.cuda.is_current_stream_capturing():
            streams = _SIDE_STREAMS[index] = (torch.cuda.Stream(index), torch.cuda.Stream(index))
    if streams is None:
        for lane, fn in enumerate(fns, start=1):
            with counter_lane(lane):
                fn()
        return
    for lane, (stream, fn) in enumerate(zip(streams, fns), start=1):
        stream.wait_stream(cur)
        with torch.cuda.stream(stream), counter_lane(lane):
            fn()
    for stream in streams:
        cur.wait_stream(stream)


def run_halves(rows: int, fn, device: torch.device) -> None:
    """fn(lo, hi) for rows [0, rows // 2) and [rows // 2, rows), as two forked branches (run_forked)."""
    half = rows // 2
    run_forked([lambda: fn(0, half), lambda: fn(half, rows)], device)


MOE_HALVES_TOKENS = 16  # decode tokens from which the MoE's expert tiles run as two sets on two streams (moe_fork)


def moe_fork(tokens: int, x: torch.Tensor):
    """The fork (run_forked on x's device) under which an MoE block of `tokens` decode tokens runs its warpgroup-MMA
    expert tiles as two sets, even and odd tiles, each set's gate/up then down on a stream of its own
    (kernels/moe/mma_moe.moe_block_mma(fork=)), or None for the joint launches. The same bits either way (each row is
    its own MMA column). H100 probe, 40 blocks at the 35B-A3B's shapes (lab/probe_moe_halves.py, lab/NOTES.md
    wave 46), us a block: 64 tokens joint 143.1, forked by expert halves 135.2 (-5.5%), as even and odd tiles 137.0
    (-4.3%); 32 tokens 111.4 -> 102.9 (by expert halves). In the model, H100, tg64 @ d512 in one call, joint -> sets:
    64 streams 5,313 / 5,327 / 5,311 -> 5,347 / 5,351 / 5,351 (+0.6%), 32 streams (the warpgroup-MMA kernel)
    3,861 -> 3,928 (+1.7%), 16 streams 2,764 -> 2,859 (+3.4%); 8 streams take the mma.sync kernel (wg_min_rows),
    which has no sets. Off CUDA the sets run one after the other."""
    if not _splits_at(MOE_HALVES_TOKENS, tokens, x):
        return None
    return lambda fns: run_forked(fns, x.device)


def mixer_decode(mixer: nn.Module, kind: str, x: torch.Tensor, batch, cache,
                 prep: GemvPrep | None = None) -> torch.Tensor:
    """A mixer's decode step of x's rows (one token a sequence) through its decode_rows(x, batch, cache, lo, hi,
    out=, prep=): one call over all rows, or, where mixer_halves(rows, x, kind), two halves of the rows on two
    streams (run_halves) writing the rows of one output [T, H] (a mixer keeps x's width), each half with its rows
    of the prep (a GEMV over a half then takes the given group sums as the whole launch would). The same bits
    either way: every launch is batch invariant."""
    t = x.shape[0]
    if not mixer_halves(t, x, kind):
        return mixer.decode_rows(x, batch, cache, 0, t, prep=prep)
    out = torch.empty_like(x)
    run_halves(t, lambda lo, hi: mixer.decode_rows(x[lo:hi], batch, cache, lo, hi, out=out[lo:hi],
                                                   prep=prep_rows(prep, lo, hi)), x.device)
    return out


def gdn_step_prep(consumer: nn.Module, x: torch.Tensor, dv: int, hv: int) -> tuple[int, int] | None:
    """(bits, group) when the DeltaNet decode step should write its out projection's prep (gdn_decode_step(prep=):
    each head's last-arriving program preps the head's outputs, so that GEMV needs no prep launch), else None: the
    fast path and a packed weight of K = hv * dv whose format the step can prep. The prep's xp equals the prep
    launch's bit for bit, its group sums follow the head's tile (an order of their own, the same at every batch
    size). H200, Qwen3.6-35B-A3B q4, tg128 @ d512, one call (lab/NOTES.md): B=1 599.2 (a prep launch) -> 607.7
    tok/s, B=64 1,755.1 -> 1,758.2."""
    if not enabled(x) or not hasattr(consumer, "scales"):
        return None
    from ..kernels.gated_delta.triton_decode import prep_supported

    s = weight_spec(consumer)
    if s.k != hv * dv or not prep_supported(dv, s.bits, s.group):
        return None
    return s.bits, s.group


def attn_merge_prep(consumer: nn.Module, x: torch.Tensor, hq: int, d: int) -> tuple[int, int] | None:
    """(bits, group) when the decode attention's merge launch should write its output projection's prep
    (paged_decode_attention(prep=): each merge block preps its columns, prep_row's arithmetic, so the GEMV gets the
    prep launch's bits without that launch), else None: the fast path's CUDA-core decode GEMV for this weight (the
    tensor-core GEMV reads group sums only, and makes its own) and a packed weight of K = hq * d whose format the
    merge can prep. On an H100 at batch 1 the graph's step 1,593.5 -> 1,581.0 us against the prep launch
    (lab/NOTES.md)."""
    if not enabled(x) or not hasattr(consumer, "scales"):
        return None
    if mma_weights(consumer, x) is not None:
        return None
    from ..kernels.attention.triton_paged import merge_prep_supported
    from ..kernels.quant.triton_gemv import use_inline_prep

    s = weight_spec(consumer)
    if s.k != hq * d or use_inline_prep(s, None) or not merge_prep_supported(d, s.bits, s.group):
        return None
    return s.bits, s.group


def _decode_out(out: torch.Tensor | None, x: torch.Tensor, n: int, new: bool = False) -> torch.Tensor | None:
    """linear(out=) checked: x's dtype, [rows of x, n], unit column stride. None passes through, or with new a fresh
    such tensor."""
    rows = x.numel() // x.shape[-1]
    if out is None:
        return torch.empty(rows, n, dtype=x.dtype, device=x.device) if new else None
    if out.dtype != x.dtype or tuple(out.shape) != (rows, n) or out.stride(-1) != 1:
        raise ValueError(f"fast.linear: out must be {x.dtype} [{rows}, {n}] with unit column stride, found {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    return out


def linear(module: nn.Module, x: torch.Tensor, decode: bool = False, conv: tuple | None = None,
           fp32_out: bool = False, out: torch.Tensor | None = None, prep: GemvPrep | None = None) -> torch.Tensor:
    """module(x), through the batch-invariant Triton kernels on the fast path.

    decode: the rows are one token per sequence. Decode steps of any batch size take a GEMV kernel in fixed blocks
    of rows (a row's bits never depend on the other rows): the tensor-core GEMV for q4 g64 weights (decode_gemv),
    else the CUDA-core one; prefill takes the tiled matmul.
    conv: (weight [C, K], pool [S, C, K-1], state_slots [B], context_lens [B], C) runs the DeltaNet decode conv in
    the GEMV's epilogue (kernels/gated_delta/triton_decode.DecodeConv): decode GEMV only (`conv_in_gemv`).
    fp32_out: the tensor-core GEMV stores fp32 (its bf16 results widened); any other path returns x's dtype.
    out: where the decode GEMVs write (x's dtype, [rows, N] with unit column stride; e.g. rows of a larger output),
    returned as a view of x's leading shape; the decode GEMV family only.
    prep: x's rows' prep as the kernel that wrote them made it (GemvPrep); the decode GEMVs use it where it was made
    for this weight's format (the tensor-core GEMV its group sums), instead of a prep of their own."""
    if out is not None and not (decode and enabled(x) and hasattr(module, "weight") and not fp32_out):
        raise ValueError("fast.linear: out= needs the fast path's decode GEMV (decode=True) and x's dtype")
    if not enabled(x) or not hasattr(module, "weight"):
        if conv is not None:
            raise ValueError("fast.linear: conv= needs the fast path's decode GEMV")
        return module(x)
    s = weight_spec(module)
    scales, biases = (None, None) if s.bits == 16 else (s.scales, s.biases)
    mma = mma_weights(module, x) if decode else None
    # the prep the kernel that wrote x made of its rows, where made for this weight's format (else the GEMV's own):
    # (xp [R, K], xs [R, K / group]); the tensor-core GEMV reads its group sums
    parts = None if prep is None else prep.for_format((s.bits, s.group))
    if mma is not None:
        from ..kernels.quant.mma_gemv import MAX_ROWS as MMA_ROWS
        from ..kernels.quant.tensor_core_gemv import tc_gemv

        xs = None if parts is None else parts[1]
        if conv is None:
            if fp32_out:
                out = torch.empty(x.numel() // x.shape[-1], s.n, dtype=torch.float32, device=x.device)
            else:
                out = _decode_out(out, x, s.n)
            return tc_gemv(x, *mma, xs=xs, out=out)  # launches of <= 64 rows inside
        x2 = x.reshape(-1, x.shape[-1])
        out = _decode_out(out, x, s.n, new=True)
        w, pool, slots, ctx, channels = conv
        for start in range(0, x2.shape[0], MMA_ROWS):  # the conv's launches: rows and their sequences sliced alike
            stop = min(start + MMA_ROWS, x2.shape[0])
            tc_gemv(x2[start:stop], *mma, out=out[start:stop], xs=None if xs is None else xs[start:stop],
                    conv=(w, pool, slots[start:stop], ctx[start:stop], channels))
        return out.view(*x.shape[:-1], s.n)
    if decode:
        from ..kernels.quant.triton_gemv import MAX_ROWS, affine_gemv

        x2 = x.reshape(-1, x.shape[-1])
        out = _decode_out(out, x, s.n, new=True)
        for start in range(0, x2.shape[0], MAX_ROWS):
            stop = min(start + MAX_ROWS, x2.shape[0])
            rows_prep = None if parts is None else (parts[0][start:stop], parts[1][start:stop])
            rows_conv = None
            if conv is not None:  # the same rows' sequences: slots and context lengths sliced alike
                w, pool, slots, ctx, channels = conv
                rows_conv = (w, pool, slots[start:stop], ctx[start:stop], channels)
            affine_gemv(x2[start:stop], s.w, scales, biases, s.bits, s.group, out=out[start:stop], conv=rows_conv,
                        prep=rows_prep)
        return out.view(*x.shape[:-1], s.n)
    if conv is not None:
        raise ValueError("fast.linear: conv= needs the decode GEMV (decode=True)")
    dense = None if decode else prefill_dense_weights(module, x)
    if dense is not None:
        from ..kernels.quant.triton_affine import tma_ok

        x2 = x.reshape(-1, s.k)
        if tma_ok(x2):  # x's rows are fetched by TMA
            from ..kernels.quant.wgmma_dense import wg_dense_mm

            words, sb, bf16_fma = dense
            return wg_dense_mm(x2, words, sb, bf16_fma=bf16_fma).view(*x.shape[:-1], s.n)
    from ..kernels.quant.triton_affine import affine_matmul

    return affine_matmul(x, s.w, scales, biases, s.bits, s.group)
