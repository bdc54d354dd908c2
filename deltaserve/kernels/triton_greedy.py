"""Greedy decoding's step-to-step feedback on the device (GPU): the argmax of each row's logits becomes its next
input token, and the row's position, context length and KV slot advance by one token, in two launches instead of
~12 torch ops (argmax, adds, the block-table lookup). Used by the captured greedy decode step
(engine/cuda_graph.DecodeGraph with greedy_feedback, what `deltaserve bench` replays).

Same results as the torch sequence it replaces (`greedy_advance_reference`):
  ids[b]   = argmax(logits[b])             the first index of the maximum (torch.argmax's tie rule)
  pos[b]  += 1;  ctx[b] += 1
  slot[b]  = tables[b, ctx[b] // BS] * BS + ctx[b] % BS     (the new ctx: the cache index of the next token)
Rows with NaN logits are outside the contract (torch returns the first NaN; these kernels never pick one).

Two launches: `_argmax_chunks` (grid B x NP, each program the first maximum of one chunk of a row), then
`_advance` (one program per row: the first maximum over its chunks in ascending order, which is the row's first
maximum, and the metadata). Both are PDL-aware; the metadata they write is read by the next forward, whose first
kernel is launched without PDL (triton_pdl).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_pdl import pdl_args, pdl_open, pdl_wait

CHUNKS = 64  # argmax programs per row: 248,320 logits -> chunks of 3,880 (4 blocks of 1,024)
BLOCK = 1024


@triton.jit
def _argmax_chunks(logit_ptr, pv_ptr, pi_ptr, V, CH, stride_l, NP: tl.constexpr, BV: tl.constexpr,
                   PDL: tl.constexpr = False):
    # grid (B, NP): pv/pi[b, c] = the maximum of logits[b, c*CH : (c+1)*CH] and its first index
    pdl_open(PDL)
    pdl_wait(PDL)
    b = tl.program_id(0)
    c = tl.program_id(1)
    start = c * CH
    stop = tl.minimum(start + CH, V)
    row = logit_ptr + b.to(tl.int64) * stride_l
    best = tl.max(tl.full((BV,), float("-inf"), tl.float32), axis=0)
    where = start
    for k0 in range(start, stop, BV):
        cols = k0 + tl.arange(0, BV)
        x = tl.load(row + cols, mask=cols < stop, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        first = tl.min(tl.where(x == m, cols, V), axis=0)
        take = m > best  # strictly greater: an earlier block keeps a tie
        where = tl.where(take, first, where)
        best = tl.maximum(best, m)
    tl.store(pv_ptr + b * NP + c, best)
    tl.store(pi_ptr + b * NP + c, where)


@triton.jit
def _advance(pv_ptr, pi_ptr, ids_ptr, pos_ptr, ctx_ptr, table_ptr, slot_ptr, V, stride_t, BS,
             NP: tl.constexpr, PDL: tl.constexpr = False):
    # grid (B,): the row's first maximum over its chunks, then its next step's metadata
    pdl_open(PDL)
    pdl_wait(PDL)
    b = tl.program_id(0)
    rc = tl.arange(0, NP)
    v = tl.load(pv_ptr + b * NP + rc)
    i = tl.load(pi_ptr + b * NP + rc)
    m = tl.max(v, axis=0)
    token = tl.min(tl.where(v == m, i, V), axis=0)  # chunks ascend: the smallest index holding the maximum
    tl.store(ids_ptr + b, token.to(ids_ptr.dtype.element_ty))
    tl.store(pos_ptr + b, tl.load(pos_ptr + b) + 1)
    ctx = tl.load(ctx_ptr + b) + 1
    tl.store(ctx_ptr + b, ctx)
    blk = tl.load(table_ptr + b.to(tl.int64) * stride_t + ctx // BS).to(tl.int64)
    tl.store(slot_ptr + b, (blk * BS + ctx % BS).to(slot_ptr.dtype.element_ty))


def greedy_advance(logits: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, context_lens: torch.Tensor,
                   block_tables: torch.Tensor, slot_mapping: torch.Tensor, block_size: int) -> None:
    """In place: input_ids [B] <- argmax(logits [B, V]), positions [B] and context_lens [B] += 1, slot_mapping [B]
    <- the KV slot of cache index context_lens (after the increment) in block_tables [B, max_blocks]. The tables
    must cover that index (the caller's invariant: the graph's tables hold every block a run will use)."""
    bsz, v = logits.shape
    for name, t in (("input_ids", input_ids), ("positions", positions), ("context_lens", context_lens),
                    ("slot_mapping", slot_mapping)):
        if t.shape != (bsz,) or not t.is_contiguous():
            raise ValueError(f"greedy_advance: {name} {tuple(t.shape)} must be a contiguous [{bsz}]")
    if block_tables.dim() != 2 or block_tables.shape[0] != bsz or block_tables.stride(-1) != 1:
        raise ValueError(f"greedy_advance: block_tables {tuple(block_tables.shape)} must be [{bsz}, max_blocks], "
                         "contiguous along the blocks")
    if logits.stride(-1) != 1 or v == 0:
        raise ValueError(f"greedy_advance: logits {tuple(logits.shape)} must be non-empty rows, contiguous")
    if bsz == 0:
        return
    chunk = triton.cdiv(triton.cdiv(v, CHUNKS), BLOCK) * BLOCK
    pv = torch.empty(bsz, CHUNKS, dtype=torch.float32, device=logits.device)
    pi = torch.empty(bsz, CHUNKS, dtype=torch.int32, device=logits.device)
    _argmax_chunks[(bsz, CHUNKS)](logits, pv, pi, v, chunk, logits.stride(0), NP=CHUNKS, BV=BLOCK, num_warps=4,
                                  **pdl_args(logits))
    _advance[(bsz,)](pv, pi, input_ids, positions, context_lens, block_tables, slot_mapping, v,
                     block_tables.stride(0), block_size, NP=CHUNKS, num_warps=1, **pdl_args(logits))


def greedy_advance_reference(logits, input_ids, positions, context_lens, block_tables, slot_mapping,
                             block_size: int) -> None:
    """The torch sequence greedy_advance replaces (the same results), in place."""
    input_ids.copy_(logits.argmax(-1))
    positions.add_(1)
    context_lens.add_(1)
    slot_mapping.copy_(cache_slots(block_tables, context_lens, block_size))


def cache_slots(block_tables: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """The flat KV slot of cache index index[b] of each row b, looked up in its block table: int64 [B]."""
    blk = block_tables.gather(1, (index // block_size).unsqueeze(1)).squeeze(1).to(torch.int64)
    return blk * block_size + index % block_size
