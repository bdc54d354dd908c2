"""The kernel plan: the GPU fast path's per-deployment choices, resolved once when the engine is built (from its
configuration, the device and the weight formats) and frozen for the engine's life.

Every choice here may change a row's last bits, so it is fixed per deployment, never per step: within a deployment
a request gets the same tokens alone or in any batch; deployments of different plans may differ in the last bits.
Choices that never change a bit (launch shapes, where a conv or a prep is made) are not here: they are the
kernels' launch constants, whose table (kernels/launch_table.py: keyed by GPU and weight shape) the plan names.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels import launch_table

DECODE_GEMV_MODES = ("mma", "cuda", "wide", "head")
MOE_FAMILIES = ("mma", "cuda")
THROUGHPUT_ROWS = 4  # a deployment whose decode forwards reach this many rows decodes on the tensor-core GEMV ("mma")


def decode_rows(max_num_seqs: int, speculative_tokens: int = 0) -> int:
    """The most rows a decode forward of the deployment carries: one per sequence, and with k drafts a step each
    sequence's k + 1 verify rows (engine/speculative.py)."""
    return max_num_seqs * (1 + speculative_tokens)


def decode_gemv_for_rows(max_rows: int) -> str:
    """The decode GEMV mode of a deployment whose decode forwards carry up to `max_rows` rows (decode_rows: an
    engine's max_num_seqs, the bench's -b, times 1 + its drafts): "head" below THROUGHPUT_ROWS, "mma" from it.
    H200, Qwen3.6-35B-A3B q4, tg64 @ d512, one call (lab/NOTES.md), head -> mma: B=1 643.5 -> 607.2 tok/s, B=2 943.1
    -> 968.9, B=4 1,297.2 -> 1,660.5, B=8 1,637.4 -> 2,303.7, B=64 2,502.4 -> 4,868.4: a deployment of 4 or more rows
    gives up 5.6% of a lone row's speed for +28% to +95% on 4 to 64 rows. A drafting deployment's verify forwards
    are such rows (k = 3 at batch 1: 4), whose linears then read each weight once for all of them."""
    if max_rows < 1:
        raise ValueError(f"decode_gemv_for_rows: max_rows must be >= 1, found {max_rows}")
    return "mma" if max_rows >= THROUGHPUT_ROWS else "head"


@dataclass(frozen=True)
class KernelPlan:
    """decode_gemv: which GEMV serves a decode step's q4 g64 linears: "mma" (the tensor-core GEMV on a copy of each
    weight repacked in MMA fragment order, +0.94 GiB at 35B-A3B), "cuda" (the CUDA-core GEMV on the MLX layout),
    "wide" (mma for weights of >= fast.WIDE_ROWS output rows) or "head" (mma for the output head only, +0.27 GiB;
    the batch-1 mode). Other weight formats always take the CUDA-core GEMV.
    moe: the MoE blocks' kernel family for q4 g64 experts: "mma" (one tensor-core family for every token count, on
    the experts repacked once; their MLX copy released) or "cuda" (CUDA-core decode kernels and a grouped wgmma
    matmul for prefill on the MLX layout: 1.4% faster at batch 1, 35% slower at pp512 and 27% at 64 streams on the
    H200, lab/NOTES.md). Blocks the tensor-core MoE cannot take run the CUDA-core kernels either way.
    The DeltaNet step's state columns and the decode attention merge's shape follow `throughput` (decode_gemv
    "mma").
    launch_table: the name of the kernels' launch-constant table on the deployment's GPU (launch_table.table():
    "default", or "default+<GPU file>" where the GPU has values of its own); the table decides, this names it."""

    decode_gemv: str = "head"
    moe: str = "mma"
    launch_table: str = "default"

    def __post_init__(self):
        if self.decode_gemv not in DECODE_GEMV_MODES:
            raise ValueError(f"decode GEMV mode must be one of {', '.join(DECODE_GEMV_MODES)}, "
                             f"found {self.decode_gemv!r}")
        if self.moe not in MOE_FAMILIES:
            raise ValueError(f"MoE kernels must be one of {', '.join(MOE_FAMILIES)}, found {self.moe!r}")

    @property
    def throughput(self) -> bool:
        """A throughput deployment (the tensor-core GEMVs everywhere: 4+ streams), whose DeltaNet step and decode
        attention merge take their wider launch shapes."""
        return self.decode_gemv == "mma"

    def describe(self) -> str:
        """One line for the bench records' notes (and the first of `deltaserve info --plan`)."""
        return (f"decode_gemv={self.decode_gemv} moe={self.moe} throughput_shapes={'on' if self.throughput else 'off'} "
                f"launch_table={self.launch_table}")

    def details(self) -> list[str]:
        """What the plan fixes, one line each (`deltaserve info --plan`)."""
        from ..kernels.attention.triton_paged import merge_shape
        from ..kernels.gated_delta.triton_decode import step_dv_block

        gemv = {"head": "the output head on the tensor-core GEMV (a repacked copy), every other linear on the "
                        "CUDA-core GEMV",
                "mma": "every linear on the tensor-core GEMV (repacked copies of the weights)",
                "wide": "linears of >= 8192 output rows on the tensor-core GEMV, the rest on the CUDA-core GEMV",
                "cuda": "every linear on the CUDA-core GEMV (the MLX layout as stored)"}[self.decode_gemv]
        moe = {"mma": "one tensor-core kernel family for every token count (the experts repacked once, their MLX "
                      "copy released)",
               "cuda": "CUDA-core decode kernels, a grouped matmul for prefill (the MLX layout as stored)"}[self.moe]
        bsp, bd = merge_shape(throughput=self.throughput)
        return [f"kernel plan: {self.describe()}",
                f"  decode GEMV (q4 g64 linears): {gemv}; other formats: the CUDA-core GEMV",
                f"  MoE blocks (q4 g64 experts): {moe}; other formats: the CUDA-core kernels",
                f"  DeltaNet decode step: {step_dv_block(self.throughput)} state columns a program",
                f"  decode attention merge: {bsp} splits a step, {bd} columns a program",
                f"  launch constants: kernels/launch_tables ({self.launch_table}; docs/launch_table.md)",
                "  (the GPU fast path only: on the CPU every op is the PyTorch reference)"]


def resolve_plan(decode_gemv: str = "auto", moe_kernels: str = "mma", max_num_seqs: int = 1,
                 speculative_tokens: int = 0) -> KernelPlan:
    """The plan of a deployment of `max_num_seqs` streams drafting `speculative_tokens` a step: decode_gemv "auto"
    follows decode_gemv_for_rows of its decode_rows; any other value (one of DECODE_GEMV_MODES) and moe_kernels
    (one of MOE_FAMILIES) are taken as given. A bad value raises a ValueError naming the option."""
    if decode_gemv != "auto" and decode_gemv not in DECODE_GEMV_MODES:
        raise ValueError(f"decode_gemv must be 'auto' or one of {', '.join(DECODE_GEMV_MODES)}, found {decode_gemv!r}")
    if moe_kernels not in MOE_FAMILIES:
        raise ValueError(f"moe_kernels must be one of {', '.join(MOE_FAMILIES)}, found {moe_kernels!r}")
    mode = decode_gemv_for_rows(decode_rows(max_num_seqs, speculative_tokens)) if decode_gemv == "auto" else decode_gemv
    return KernelPlan(decode_gemv=mode, moe=moe_kernels, launch_table=launch_table.table().name)
