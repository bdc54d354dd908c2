"""Test-only draft sources for speculative decoding: drafts are the reply's own tokens, recorded from an undrafted
run, right up to a chosen position (so every acceptance length is exercised, which random weights never give)."""

from __future__ import annotations

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
        out = {}
        for row in rows:
            if not row.frontier or row.k == 0:
                continue
            req = row.request
            o = row.start + row.next_tokens.numel() - req.num_prompt_tokens  # output index of the newest token
            future = self.recorded[req.request_id][o + 1: o + 1 + row.k]
            drafts = []
            for i in range(row.k):
                true = future[i] if i < len(future) else 0
                drafts.append(true if self.right is None or i < self.right else (true + 1) % self.vocab)
            out[req.request_id] = drafts
            self.proposed += len(drafts)
        return out
