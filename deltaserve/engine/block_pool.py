"""Allocators for the two cache kinds: paged KV blocks (full-attention layers) and DeltaNet state slots.

Pure bookkeeping over integer ids; the tensors live in the model's `HybridCache`. Invariant: every id is either
free or owned by exactly one request (double frees and foreign ids raise).
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    """Fixed pool of KV blocks of `block_size` tokens each; ids 0..num_blocks-1."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"BlockPool needs positive num_blocks and block_size, found {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold num_tokens tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"KV block pool exhausted: asked {num_blocks}, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(num_blocks)]
        self._used.update(ids)
        return ids

    def may_append(self, block_table: list[int], num_tokens: int) -> None:
        """Grow block_table in place so it covers num_tokens tokens (allocates only the missing blocks)."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > 0:
            block_table.extend(self.allocate(missing))

    def free(self, ids: list[int]) -> None:
        for i in ids:
            if i not in self._used:
                raise RuntimeError(f"KV block {i} freed but not allocated")
            self._used.remove(i)
            self._free.append(i)


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
