"""The hybrid prefix cache: shared KV blocks plus DeltaNet state snapshots (pure bookkeeping; the tensors live in
the model's HybridCache).

A request can skip the prefill of a prompt prefix when both parts of that prefix's state exist:
  KV       every full block of the prefix, found by a hash chain of its tokens (each block's hash covers its
           parent's hash, its token ids and the cache's salt: the KV dtype and anything else that changes what a
           block holds, e.g. a request's image content), shared by reference count (block_pool.BlockPool); only
           blocks that prompt chunks computed in whole aligned windows are shared (`register`);
  DeltaNet a snapshot of the conv windows and recurrent states of every linear-attention layer at the prefix's end,
           copied from the request's state slot when a prompt chunk ends there. A snapshot is ~60 MiB for the 35B-A3B
           model, so they are taken only at chosen seams (`seams`) and kept within a budget, least recently used
           first out; a snapshot is keyed by the hash of the block that ends at its seam.
A lookup takes the longest prefix with both (at least one prompt token is always left to compute).

Exactness: snapshots are taken and resumed only at positions that are multiples of `align` (64 = the chunked
DeltaNet's chunk length, and a multiple of the block size), and the scheduler cuts every prompt at such positions
the same way whether it starts fresh or resumes (scheduler.prefill_chunk), so a resumed request computes the same
chunks, hence the same bits, as the same request from scratch.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from .block_pool import BlockPool
from .request import Request

ALIGN_TOKENS = 64  # chunks are cut, snapshots taken and resumed at multiples of this (with the block size: the lcm)


def block_hash(parent: bytes, tokens, salt: bytes) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(salt)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


@dataclass
class Match:
    blocks: list[int]  # the shared KV blocks of the prefix
    tokens: int  # prefix length (a multiple of align)
    snapshot: int | None  # the snapshot to load into the request's state slot


class PrefixCache:
    def __init__(self, blocks: BlockPool, num_snapshots: int, align: int, salt: bytes = b"",
                 interval: int | None = 4096):
        if num_snapshots < 1:
            raise ValueError(f"PrefixCache needs at least one snapshot, found {num_snapshots}")
        self.blocks, self.align, self.salt = blocks, align, salt
        self.interval = interval  # long prompts also snapshot at multiples of this many tokens (None: never)
        self.num_snapshots = num_snapshots
        self._snapshots: OrderedDict[bytes, int] = OrderedDict()  # seam block's hash -> snapshot id, LRU first
        self._free_snaps: deque[int] = deque(range(num_snapshots))
        blocks.on_evict = self._forget_snapshot
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # prompt tokens served from the cache

    # ---- hashing ---------------------------------------------------------------------------------------------
    def hashes(self, req: Request, num_blocks: int) -> list[bytes]:
        """The hash chain of the request's first num_blocks full blocks (of its known tokens), extending the
        request's cached chain."""
        bs = self.blocks.block_size
        chain = req.block_hashes
        root = self.salt + req.cache_salt
        while len(chain) < num_blocks:
            i = len(chain)
            chain.append(block_hash(chain[-1] if chain else b"", req.token_slice(i * bs, (i + 1) * bs), root))
        return chain[:num_blocks]

    # ---- lookup ----------------------------------------------------------------------------------------------
    def match(self, req: Request) -> Match:
        """The longest cached prefix of the request's prompt with its KV blocks and a snapshot (empty Match: none).
        Takes no references and counts nothing (the scheduler does both when it admits the request)."""
        bs = self.blocks.block_size
        p = req.num_prompt_tokens
        usable = (p - 1) // bs  # full blocks that still leave a token to compute
        found: list[int] = []
        for h in self.hashes(req, usable):
            b = self.blocks.lookup(h)
            if b is None:
                break
            found.append(b)
        chain = req.block_hashes
        for k in range(len(found), 0, -1):
            if (k * bs) % self.align == 0 and chain[k - 1] in self._snapshots:
                self._snapshots.move_to_end(chain[k - 1])
                return Match(found[:k], k * bs, self._snapshots[chain[k - 1]])
        return Match([], 0, None)

    # ---- snapshots -------------------------------------------------------------------------------------------
    def seams(self, req: Request, hints=()) -> list[int]:
        """Where the request's prompt takes snapshots (and its chunks end), ascending: its last aligned position
        (where the next turn of a chat resumes), each hint (e.g. a chat message boundary) rounded down to one, and
        every `interval` tokens of a long prompt; never 0."""
        a, p = self.align, req.num_prompt_tokens
        points = {p // a * a} | {min(int(h), p) // a * a for h in hints}
        if self.interval:
            points |= set(range(self.interval, p + 1, self.interval))
        return sorted(s for s in points if 0 < s <= p)

    def snapshot_for(self, req: Request, seam: int) -> int | None:
        """A snapshot id to copy the request's state into, now that its prompt is computed up to `seam`: None when
        that prefix has one already. May take back the least recently used snapshot."""
        h = self.hashes(req, seam // self.blocks.block_size)[-1]
        if h in self._snapshots:
            self._snapshots.move_to_end(h)
            return None
        if not self._free_snaps:
            _, old = self._snapshots.popitem(last=False)
            self._free_snaps.append(old)
        snap = self._free_snaps.popleft()
        self._snapshots[h] = snap
        return snap

    def _forget_snapshot(self, block_hash_: bytes) -> None:
        """A block's contents were evicted: a snapshot at its end can never be matched again."""
        snap = self._snapshots.pop(block_hash_, None)
        if snap is not None:
            self._free_snaps.append(snap)

    @property
    def num_snapshots_used(self) -> int:
        return len(self._snapshots)

    # ---- registering computed blocks -------------------------------------------------------------------------
    def register(self, req: Request, prefilled: int) -> None:
        """Register the request's blocks of its first `prefilled` prompt tokens (an aligned position its prompt
        chunks reached; blocks it owns alone: shared ones are registered already).

        Only blocks of whole aligned windows computed by prompt chunks are ever registered: a position's KV
        depends on how its hidden states were computed (a prompt chunk's chunked DeltaNet, or a decode step's
        recurrent one), and a request resuming from the cache must find the bits its own prompt chunks would
        have made. So generated tokens and a prompt's unaligned tail are never shared (the next turn of a chat
        recomputes the reply from the previous prompt's last aligned position)."""
        bs = self.blocks.block_size
        full = prefilled // self.align * self.align // bs
        if full <= req.num_registered_blocks:
            return
        chain = self.hashes(req, full)
        for i in range(req.num_registered_blocks, full):
            self.blocks.register(req.block_table[i], chain[i])
        req.num_registered_blocks = full
