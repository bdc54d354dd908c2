"""Allocators for the two cache kinds: paged KV blocks (full-attention layers) and DeltaNet state slots.

Pure bookkeeping over integer ids; the tensors live in the model's `HybridCache`.

KV blocks are reference-counted so that requests can share the full blocks of a common prompt prefix (the prefix
cache, engine/prefix_cache.py). A block is in exactly one of three states:
  free       no owner, no cached contents: handed out first;
  owned      ref >= 1 (one per request whose block table holds it);
  evictable  ref == 0 but its contents are registered under a content hash: reusable by a later request with the
             same prefix, or taken (least recently used first, its hash dropped) when no free block is left.
Invariants: ref counts never go negative (a double free raises); only full blocks whose tokens are all computed are
ever registered, and a registered block is never written again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Callable


class BlockPool:
    """Fixed pool of KV blocks of `block_size` tokens each; ids 0..num_blocks-1."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"BlockPool needs positive num_blocks and block_size, found {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref = [0] * num_blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, registered: LRU first
        self.hash_of: dict[int, bytes] = {}  # registered block -> its content hash
        self.by_hash: dict[bytes, int] = {}  # content hash -> the block that holds it
        self.on_evict: Callable[[bytes], None] | None = None  # told each hash whose block is taken back

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free ones and evictable (cached, unreferenced) ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self.hash_of)

    def ref(self, block: int) -> int:
        return self._ref[block]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold num_tokens tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"KV block pool exhausted: asked {num_blocks}, {self.num_free} free")
        ids = []
        for _ in range(num_blocks):
            if self._free:
                block = self._free.popleft()
            else:  # the least recently used cached block: its contents are forgotten
                block, _ = self._evictable.popitem(last=False)
                self._unregister(block)
            self._ref[block] = 1
            ids.append(block)
        return ids

    def may_append(self, block_table: list[int], num_tokens: int) -> None:
        """Grow block_table in place so it covers num_tokens tokens (allocates only the missing blocks)."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > 0:
            block_table.extend(self.allocate(missing))

    def free(self, ids: list[int]) -> None:
        """Drop one reference to each block; a block nobody references becomes free, or evictable if cached."""
        for i in ids:
            if self._ref[i] <= 0:
                raise RuntimeError(f"KV block {i} freed but not allocated")
            self._ref[i] -= 1
            if self._ref[i] == 0:
                if i in self.hash_of:
                    self._evictable[i] = None
                else:
                    self._free.append(i)

    # ---- the prefix cache's side -----------------------------------------------------------------------------
    def register(self, block: int, content_hash: bytes) -> bool:
        """Record that an owned, full, computed block holds the contents `content_hash` identifies. False (and
        nothing recorded) when another block already holds them, or this one is registered."""
        if self._ref[block] <= 0:
            raise RuntimeError(f"KV block {block} registered while not owned")
        if content_hash in self.by_hash or block in self.hash_of:
            return False
        self.hash_of[block] = content_hash
        self.by_hash[content_hash] = block
        return True

    def lookup(self, content_hash: bytes) -> int | None:
        return self.by_hash.get(content_hash)

    def share(self, block: int) -> None:
        """One more reference to a registered block (a prefix hit): taken out of the evictable set if it was there."""
        if block not in self.hash_of:
            raise RuntimeError(f"KV block {block} shared but not registered")
        if self._ref[block] == 0:
            del self._evictable[block]
        self._ref[block] += 1

    def num_evictable_among(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self._ref[b] == 0)

    def _unregister(self, block: int) -> None:
        h = self.hash_of.pop(block)
        del self.by_hash[h]
        if self.on_evict is not None:
            self.on_evict(h)


class StateSlotPool:
    """Fixed pool of DeltaNet state slots (conv + recurrent state), one per running sequence."""

    def __init__(self, num_slots: int):
        if num_slots <= 0:
            raise ValueError(f"StateSlotPool needs a positive number of slots, found {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self) -> bool:
        return bool(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("DeltaNet state slots exhausted")
        slot = self._free.popleft()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise RuntimeError(f"state slot {slot} freed but not allocated")
        self._used.remove(slot)
        self._free.append(slot)
