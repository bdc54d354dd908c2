"""Test-only draft sources for speculative decoding: drafts are the reply's own tokens, recorded from an undrafted
run, right up to a chosen position (so every acceptance length is exercised, which random weights never give)."""

from __future__ import annotations

from deltaserve.bench.spec_bench import recorded_drafts
from deltaserve.engine.speculative import DraftRows


class RecordedDrafts:
    """Proposes, after the token at output index o, the recorded tokens o+1 .. o+k of the same request, the first
    `right` of them as recorded and the rest changed (so they are rejected); right=None: all right. `recorded` maps
    a request id to its undrafted output tokens. Counts what it proposed."""

    needs_hidden = False

    def __init__(self, recorded: dict[str, list[int]], vocab: int, right: int | None = None):
        self.recorded, self.vocab, self.right = recorded, vocab, right
        self.proposed = 0

    def propose(self, rows: list[DraftRows]) -> dict[str, list[int]]:
        out = recorded_drafts(rows, self.recorded, self.vocab, lambda i: self.right is None or i < self.right)
        self.proposed += sum(len(d) for d in out.values())
        return out
