"""Gated DeltaNet for speculative verification: several consecutive tokens of a sequence through the decode
step's arithmetic, the state chained in registers and left unwritten, then a commit of the accepted prefix.

A verify forward gives each drafting sequence b its n_b = 1 + k_b tokens (the last sampled token, then k_b drafts)
as consecutive rows [cu_seqlens[b], cu_seqlens[b + 1]). Exactness asks every row's output, and the state after
the kept rows, to be the bits one-token decode steps would give. So verify, commit and the decode step are ONE
compiled kernel (triton_decode._step_rows_kernel, its mode a runtime argument): a program loads its state columns,
walks its sequence's rows with the state in registers (an fp32 store and reload between decode steps are exact),
and the machine code of a row's update is the same in every mode. (Separate kernels of the same source did not
suffice: on the H100 the compiler contracted the delta rule's multiply-adds differently in each, and the committed
states differed from the decode steps' in their last bits while the bf16 outputs agreed.)

  gdn_verify_step   STEP_VERIFY: every row's output (and, where the decode step does, the out projection's prep)
                    as the decode step makes it; the state is NOT written, unless n_b == 1 (nothing can be
                    rejected: the decode step itself).
  gdn_verify_commit STEP_COMMIT, after the acceptance is known (keep [B] device-side: rows of each sequence to
                    keep, 1 + its accepted drafts): the same programs replay rows 0 .. keep_b - 1 from the same
                    inputs (outputs to scratch) and write the state after the last kept row; sequences with n_b == 1
                    (already written) are skipped.
  conv_commit       the conv windows: the verify runs triton_decode.causal_conv with write_state=False (its
                    multi-token path equals the decode GEMV's conv epilogue bit for bit: quant.triton_gemv's
                    contract), leaving each slot's window as it was; the commit writes the window after keep_b rows,
                    the last K-1 of [old window ; x_0 .. x_{keep_b - 1}] (x: the pre-conv projection rows).

Why recompute rather than keep a state per verified position (vLLM's way): per DeltaNet layer and sequence, with
S its state's bytes (2 MiB for 35B-A3B), per-position snapshots cost a read and k + 1 writes (and k + 1 state slots
of memory per sequence), the recompute a read in the verify and a read + a write in the commit: 3 S against
(k + 2) S, equal at k = 1 and cheaper from k = 2, with no extra memory. Cheaper still (2 S, a plain decode's) would
be to fold the commit into the NEXT step's kernels (replay the kept rows before the new ones); that needs every
path touching the state (prefill, the decode GEMV's conv epilogue) to know about pending rows: a follow-up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_pdl import pdl_args, pdl_open, pdl_wait
from ..launch_table import value as launch_value
from .triton_decode import (DV_DEFAULT, STEP_COMMIT, STEP_VERIFY, check_step_rows, launch_step_rows,
                            resolve_dv_block)


@triton.jit
def _conv_commit_kernel(x_ptr, pool_ptr, cu_ptr, slot_ptr, ctx_ptr, keep_ptr, C, stride_xt, stride_ps, stride_pc,
                        stride_pk, KW: tl.constexpr, KWP: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr = False):
    # grid (B, cdiv(C, BC)): window'[j] = ([window ; x_0 .. x_{n-1}])[keep + j], j < KW - 1 (the window's KW - 1
    # entries first, oldest first; zeros for a fresh sequence). Every read before the barrier, then the stores.
    pdl_open(PDL)
    bi = tl.program_id(0)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    c_mask = rc < C
    start = tl.load(cu_ptr + bi)
    n = tl.load(cu_ptr + bi + 1) - start
    pdl_wait(PDL)
    keep = tl.minimum(tl.load(keep_ptr + bi).to(tl.int32), n.to(tl.int32))
    slot = tl.load(slot_ptr + bi).to(tl.int64)
    fresh = tl.load(ctx_ptr + bi) == 0
    rj = tl.arange(0, KWP)
    j_mask = rj < KW - 1
    src = keep + rj  # index into [window (KW - 1) ; x rows]
    from_x = src >= KW - 1
    st = pool_ptr + slot * stride_ps + rc[None, :] * stride_pc
    xv = tl.load(x_ptr + (start + src - (KW - 1)).to(tl.int64)[:, None] * stride_xt + rc[None, :],
                 mask=(j_mask & from_x)[:, None] & c_mask[None, :], other=0.0)
    sv = tl.load(st + src[:, None] * stride_pk, mask=(j_mask & ~from_x & ~fresh)[:, None] & c_mask[None, :],
                 other=0.0)
    new = tl.where(from_x[:, None], xv.to(pool_ptr.dtype.element_ty), sv.to(pool_ptr.dtype.element_ty))
    tl.debug_barrier()
    tl.store(st + rj[:, None] * stride_pk, new, mask=(j_mask & (keep > 0))[:, None] & c_mask[None, :])


def _check(what, qkv, z, a, b, norm_weight, ssm_pool, cu_seqlens, state_slots, context_lens, num_k_heads, prep,
           dv_block) -> None:
    """The step's own checks (triton_decode.check_step_rows), and one cu_seqlens / context length per sequence."""
    check_step_rows(what, qkv, z, a, b, norm_weight, ssm_pool, num_k_heads, prep, dv_block)
    nseq = state_slots.numel()
    if cu_seqlens.numel() != nseq + 1 or context_lens.numel() != nseq:
        raise ValueError(f"{what}: {nseq} state slots, {cu_seqlens.numel()} cu_seqlens, {context_lens.numel()} "
                         "context lengths")


def gdn_verify_step(
    qkv_conv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
    dt_bias: torch.Tensor, norm_weight: torch.Tensor, ssm_pool: torch.Tensor, cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor, context_lens: torch.Tensor, num_k_heads: int, eps: float,
    out: torch.Tensor | None = None, dv_block: int | str | None = DV_DEFAULT, num_warps: int | None = None,
    prep: tuple[int, int] | None = None,
):
    """The decode step (triton_decode.gdn_decode_step, same arguments and outputs) for B sequences of n_b >= 1
    consecutive rows each (cu_seqlens [B+1]; state_slots, context_lens [B] per sequence; every other tensor per
    row: qkv_conv [T, C], z [T, Hv*dv], a, b [T, Hv]). Row i of a sequence gets the bits the decode step would give
    it after rows 0 .. i-1 were decoded (the decode step's own kernel, STEP_VERIFY); the state is not written
    (gdn_verify_commit writes it once the kept rows are known), except for a sequence of one row, whose state is
    written as the decode step writes it. dv_block, num_warps, prep: the deployment's decode step's (they are part
    of a row's bits)."""
    dv_block = resolve_dv_block(dv_block)
    _check("gdn_verify_step", qkv_conv, z, a, b, norm_weight, ssm_pool, cu_seqlens, state_slots, context_lens,
           num_k_heads, prep, dv_block)
    o = torch.empty(z.shape, dtype=qkv_conv.dtype, device=qkv_conv.device) if out is None else out
    made = launch_step_rows(STEP_VERIFY, qkv_conv, z, a, b, a_log, dt_bias, norm_weight, ssm_pool, cu_seqlens,
                            cu_seqlens, state_slots, context_lens, num_k_heads, eps, o, prep, dv_block, num_warps)
    return (o, made) if prep else o


def gdn_verify_commit(
    qkv_conv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
    dt_bias: torch.Tensor, norm_weight: torch.Tensor, ssm_pool: torch.Tensor, cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor, context_lens: torch.Tensor, keep: torch.Tensor, num_k_heads: int, eps: float,
    dv_block: int | str | None = DV_DEFAULT, num_warps: int | None = None, prep: tuple[int, int] | None = None,
) -> None:
    """Write each sequence's state after its first keep[b] rows (device tensor [B]; clipped to n_b; 0 leaves the
    state as it was) of the gdn_verify_step just run on the same inputs, in place at state_slots. Sequences of one
    row are skipped (the verify wrote them). The replay is the decode step's own kernel (STEP_COMMIT) with every
    argument of the verify (dv_block, num_warps, prep: the state's bits follow the compiled kernel); its outputs
    go to scratch."""
    dv_block = resolve_dv_block(dv_block)
    _check("gdn_verify_commit", qkv_conv, z, a, b, norm_weight, ssm_pool, cu_seqlens, state_slots, context_lens,
           num_k_heads, prep, dv_block)
    if keep.numel() != state_slots.numel():
        raise ValueError(f"gdn_verify_commit: keep has {keep.numel()} entries for {state_slots.numel()} sequences")
    scratch = torch.empty(z.shape, dtype=qkv_conv.dtype, device=qkv_conv.device)
    launch_step_rows(STEP_COMMIT, qkv_conv, z, a, b, a_log, dt_bias, norm_weight, ssm_pool, cu_seqlens, keep,
                     state_slots, context_lens, num_k_heads, eps, scratch, prep, dv_block, num_warps)


def conv_commit(x: torch.Tensor, conv_pool: torch.Tensor, cu_seqlens: torch.Tensor, state_slots: torch.Tensor,
                context_lens: torch.Tensor, keep: torch.Tensor) -> None:
    """Each sequence's conv window [C, K-1] after its first keep[b] rows (device [B], clipped to n_b; 0: unchanged)
    of x [T, C], the pre-conv projection rows a verify ran through causal_conv(write_state=False): the last K-1 of
    [window ; x rows 0 .. keep_b - 1] (a fresh sequence's window reads as zeros). In place at state_slots."""
    t, c = x.shape
    nseq = state_slots.numel()
    if conv_pool.shape[1] != c or x.stride(-1) != 1 or keep.numel() != nseq or cu_seqlens.numel() != nseq + 1:
        raise ValueError(f"conv_commit: x {tuple(x.shape)} (contiguous channels), pool {tuple(conv_pool.shape)}, "
                         f"{keep.numel()} keep and {cu_seqlens.numel()} cu_seqlens for {nseq} sequences disagree")
    if nseq == 0:
        return
    kw = conv_pool.shape[2] + 1
    bc = launch_value("deltanet.conv_commit_block")
    _conv_commit_kernel[(nseq, triton.cdiv(c, bc))](
        x, conv_pool, cu_seqlens, state_slots, context_lens, keep, c, x.stride(0), conv_pool.stride(0),
        conv_pool.stride(1), conv_pool.stride(2), KW=kw, KWP=triton.next_power_of_2(kw - 1), BC=bc,
        num_warps=4, **pdl_args(conv_pool),
    )
