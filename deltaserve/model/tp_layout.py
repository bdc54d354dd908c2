"""Which heads, rows and experts each of N tensor-parallel ranks holds (the layout; model/parallel.py holds the
collectives). Every split is written in the checkpoint's own coordinates, so the loader can cut any format's tensors
from it (weights/shard.py) and the model is built from `local_config()` at the rank's sizes.

Rank r of N holds
  gated attention   q heads [r Hq/N, (r+1) Hq/N) (each head's q|gate rows), the KV heads they read: Hkv/N of them
                    when Hkv >= N, else the one KV head of its q heads' group (replicated over N/Hkv ranks, as vLLM
                    does); o_proj the matching input columns (row-parallel: the output is a partial sum)
  Gated DeltaNet    value heads [r Hv/N, (r+1) Hv/N) and the key heads they read (value head h reads key head
                    h // (Hv/Hk); key heads replicated over N/Hk ranks when Hk < N): the Q, K and V rows of the flat
                    [Q; K; V] in_proj_qkv and the same conv1d channels (concatenated in that order, so the local
                    layout is again [Q; K; V]), the z rows, b/a rows, A_log and dt_bias of its value heads;
                    out_proj the matching input columns (row-parallel)
  dense MLP and the shared expert: intermediate rows [r I/N, (r+1) I/N) of gate and up, the same columns of down
  routed experts    tensor-parallel: that intermediate slice of every expert; expert-parallel: experts
                    [r E/N, (r+1) E/N) whole
  embed_tokens, lm_head: vocabulary rows [r V/N, (r+1) V/N)
  replicated        the router (mlp.gate), shared_expert_gate, every norm (q/k norms and the DeltaNet gated norm are
                    per head, so they need no split)
A size that does not divide a field is refused with a ValueError naming the field and both numbers.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .config import ModelConfig

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Split:
    """One axis of a module or parameter divided among the ranks: this rank holds the full-axis ranges `owned`
    ([lo, hi), increasing), stored one after the other in its local tensor. axis: "out" (output rows), "in" (input
    columns), "inter" (routed experts' intermediate width), "expert" (routed experts), "dim0" (a raw parameter's
    first dimension); `full` is the whole axis."""

    axis: str
    full: int
    owned: Ranges

    @property
    def local(self) -> int:
        return sum(hi - lo for lo, hi in self.owned)


def _scaled(ranges: Ranges, unit: int, offset: int = 0) -> Ranges:
    return tuple((offset + lo * unit, offset + hi * unit) for lo, hi in ranges)


def grouped_heads(heads: int, groups: int, rank: int, size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(head range, group range) of `rank`, where head h reads group h // (heads / groups): q heads and KV heads,
    or DeltaNet value heads and key heads. Groups are split when there are at least `size` of them, else each rank
    holds the one group its heads read (the caller checked heads % size == 0 and that size divides or is divided
    by groups)."""
    per = heads // size
    h0 = rank * per
    if groups >= size:
        g_per = groups // size
        return (h0, h0 + per), (rank * g_per, rank * g_per + g_per)
    g0 = h0 // (heads // groups)
    return (h0, h0 + per), (g0, g0 + 1)


# module paths (parameter names without the leaf) and the raw parameters the layout splits
_ATTN = re.compile(r"^layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)$")
_GDN = re.compile(r"^layers\.\d+\.linear_attn\.(in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|out_proj)$")
_GDN_PARAM = re.compile(r"^layers\.\d+\.linear_attn\.(conv1d\.weight|A_log|dt_bias)$")
_MLP = re.compile(r"^layers\.\d+\.mlp\.(shared_expert\.)?(gate_proj|up_proj|down_proj)$")
_EXPERTS = re.compile(r"^layers\.\d+\.mlp\.experts$")
_REPLICATED = re.compile(r"^layers\.\d+\.mlp\.(gate|shared_expert_gate)$")


class TPLayout:
    """The split of one model over `size` ranks, seen from `rank`. expert_parallel: routed experts whole, E/N per
    rank, instead of every expert's intermediate slice."""

    def __init__(self, config: ModelConfig, rank: int, size: int, expert_parallel: bool = False):
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"tensor-parallel rank {rank} of size {size}: need 0 <= rank < size")
        if expert_parallel and not config.is_moe:
            raise ValueError("enable_expert_parallel needs a MoE model (num_experts > 0); this model is dense")
        self.config, self.rank, self.size, self.expert_parallel = config, rank, size, expert_parallel
        check_divisible(config, size, expert_parallel)
        c = config
        self.q_heads, self.kv_heads = grouped_heads(c.num_attention_heads, c.num_key_value_heads, rank, size)
        self.v_heads, self.k_heads = grouped_heads(c.linear_num_value_heads, c.linear_num_key_heads, rank, size)

    # ---- sizes ---------------------------------------------------------------------------------------------
    def _even(self, n: int) -> tuple[int, int]:
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per

    @property
    def vocab_range(self) -> tuple[int, int]:
        return self._even(self.config.vocab_size)

    @property
    def expert_range(self) -> tuple[int, int] | None:
        """The routed experts this rank holds under expert parallelism, else None (it holds a slice of each)."""
        return self._even(self.config.num_experts) if self.expert_parallel else None

    def local_config(self) -> ModelConfig:
        """The config the rank's model is built from: head counts and feed-forward widths at the rank's share;
        num_experts (the router's width) and vocab_size (the logits' width after the gather) stay global. The
        embedding, lm_head and, under expert parallelism, the expert bank come out at their local sizes from the
        sharded weight factory (weights/shard.py)."""
        c = self.config
        span = lambda r: r[1] - r[0]  # noqa: E731
        moe_inter = c.moe_intermediate_size if self.expert_parallel else c.moe_intermediate_size // self.size
        return dataclasses.replace(
            c,
            num_attention_heads=span(self.q_heads),
            num_key_value_heads=span(self.kv_heads),
            linear_num_key_heads=span(self.k_heads),
            linear_num_value_heads=span(self.v_heads),
            intermediate_size=None if c.intermediate_size is None else c.intermediate_size // self.size,
            moe_intermediate_size=moe_inter,
            shared_expert_intermediate_size=c.shared_expert_intermediate_size // self.size,
        )

    # ---- splits ------------------------------------------------------------------------------------------------
    def module_split(self, path: str) -> Split | None:
        """How module `path` (e.g. "layers.3.self_attn.o_proj") is divided; None for a replicated module. A module
        the layout does not know raises: an unsplit module would silently hold the wrong rows."""
        c = self.config
        m = _ATTN.match(path)
        if m:
            d = c.head_dim
            width = d * (2 if c.attn_output_gate else 1)
            if m.group(1) == "q_proj":
                return Split("out", c.num_attention_heads * width, _scaled((self.q_heads,), width))
            if m.group(1) == "o_proj":
                return Split("in", c.num_attention_heads * d, _scaled((self.q_heads,), d))
            return Split("out", c.num_key_value_heads * d, _scaled((self.kv_heads,), d))
        m = _GDN.match(path)
        if m:
            dv = c.linear_value_head_dim
            part = m.group(1)
            if part == "in_proj_qkv":
                return Split("out", c.conv_dim, self._qkv_rows())
            if part == "in_proj_z":
                return Split("out", c.value_dim, _scaled((self.v_heads,), dv))
            if part == "out_proj":
                return Split("in", c.value_dim, _scaled((self.v_heads,), dv))
            return Split("out", c.linear_num_value_heads, (self.v_heads,))  # in_proj_b, in_proj_a
        m = _MLP.match(path)
        if m:
            inter = c.shared_expert_intermediate_size if m.group(1) else c.intermediate_size
            axis = "in" if m.group(2) == "down_proj" else "out"
            return Split(axis, inter, (self._even(inter),))
        if _EXPERTS.match(path):
            if self.expert_parallel:
                return Split("expert", c.num_experts, (self._even(c.num_experts),))
            return Split("inter", c.moe_intermediate_size, (self._even(c.moe_intermediate_size),))
        if path in ("embed_tokens", "lm_head"):
            return Split("out", c.vocab_size, (self.vocab_range,))
        if _REPLICATED.match(path):
            return None
        raise ValueError(f"tensor parallelism does not know how to split module '{path}' "
                         f"(tensor_parallel_size {self.size})")

    def param_split(self, name: str) -> Split | None:
        """The split of a raw parameter (not held by a factory module) along its first dimension, or None."""
        m = _GDN_PARAM.match(name)
        if m is None:
            return None
        if m.group(1) == "conv1d.weight":
            return Split("dim0", self.config.conv_dim, self._qkv_rows())
        return Split("dim0", self.config.linear_num_value_heads, (self.v_heads,))  # A_log, dt_bias

    def _qkv_rows(self) -> Ranges:
        """The rank's rows of the flat [Q; K; V] projection (and conv channels): its key heads' Q rows, their K rows,
        its value heads' V rows."""
        c = self.config
        dk, dv, key_dim = c.linear_key_head_dim, c.linear_value_head_dim, c.key_dim
        return (_scaled((self.k_heads,), dk) + _scaled((self.k_heads,), dk, key_dim)
                + _scaled((self.v_heads,), dv, 2 * key_dim))


def check_divisible(config: ModelConfig, size: int, expert_parallel: bool = False) -> None:
    """Refuse a tensor_parallel_size the model cannot be split by, naming the field and both numbers."""
    if size == 1:
        return
    c = config
    problems = []

    def need_multiple(field: str, value: int | None) -> None:
        if value and value % size:
            problems.append(f"{field} = {value} is not a multiple of {size}")

    def need_grouped(field: str, value: int, heads_field: str) -> None:
        if value % size and size % value:
            problems.append(f"{field} = {value} neither is a multiple of {size} nor divides it (the {heads_field} "
                            "of one rank must read whole groups)")

    need_multiple("num_attention_heads", c.num_attention_heads)
    need_grouped("num_key_value_heads", c.num_key_value_heads, "q heads")
    need_multiple("linear_num_value_heads", c.linear_num_value_heads)
    need_grouped("linear_num_key_heads", c.linear_num_key_heads, "value heads")
    need_multiple("vocab_size", c.vocab_size)
    need_multiple("intermediate_size", c.intermediate_size if not all(c.sparse_layers) else None)
    need_multiple("shared_expert_intermediate_size", c.shared_expert_intermediate_size)
    if c.is_moe:
        if expert_parallel:
            need_multiple("num_experts", c.num_experts)
        else:
            need_multiple("moe_intermediate_size", c.moe_intermediate_size)
    if problems:
        raise ValueError(f"tensor_parallel_size {size} cannot split this {c.model_type} model: "
                         + "; ".join(problems))
