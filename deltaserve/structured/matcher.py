"""One request's constraint while it generates (RequestGrammar), and the batch's allowed-token mask (token_bitmask).

The matcher follows the request's own output tokens only, so a row's mask (and with it its token, a pure function of
the masked logits, seed and position) does not depend on which other requests share the batch.

Reasoning gate (`after_think`): while the reply is inside the model's reasoning nothing is masked; the token that
closes it (</think>) opens the gate, and the grammar applies from the next token on. The reasoning never reaches the
matcher.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Sequence

import torch

ACCEPTED = "accepted"  # the token fits; go on
COMPLETE = "complete"  # the token ended the grammar (an end-of-sequence id where the reply is complete)
REJECTED = "rejected"  # the token does not fit: a dead end (the grammar allowed nothing here, or a stale mask)

_batch_matcher: Any = None  # one xgrammar.BatchGrammarMatcher (its thread pool) for every engine in the process


class RequestGrammar:
    """A request's compiled grammar (a Future until compiled), its matcher and its reasoning gate."""

    def __init__(self, compiled: Future, think_end_id: int | None = None):
        self.compiled = compiled
        self.think_end_id = think_end_id  # None: constrained from the first output token
        self.in_reasoning = think_end_id is not None
        self._matcher: Any = None
        self._ahead: list[tuple[int, str]] = []  # (token, verdict) fed early by accept_ahead, oldest first

    @property
    def ready(self) -> bool:
        return self.compiled.done()

    def error(self) -> BaseException | None:
        """The compile error, once done (None while compiling or when it succeeded)."""
        return self.compiled.exception() if self.compiled.done() else None

    @property
    def matcher(self) -> Any:
        if self._matcher is None:
            import xgrammar as xgr

            self._matcher = xgr.GrammarMatcher(self.compiled.result())
        return self._matcher

    @property
    def constrains_next(self) -> bool:
        """Is the next token masked? (False inside the reasoning and after the grammar has ended.)"""
        return not self.in_reasoning and not self.matcher.is_terminated()

    def accept(self, token: int) -> str:
        """Advance with the request's next output token: ACCEPTED, COMPLETE or REJECTED (the matcher is unchanged
        on REJECTED). A token already fed by accept_ahead returns its verdict then."""
        if self._ahead:
            fed, verdict = self._ahead.pop(0)
            if fed != token:
                raise RuntimeError(f"grammar fed token {fed} ahead, but the request's next token is {token}")
            return verdict
        return self._advance(token)

    def accept_ahead(self, token: int) -> None:
        """Feed the next output token before the engine appends it (the engine runs one step ahead of its
        read-back; the next mask needs this token); accept(token) later returns the verdict."""
        self._ahead.append((token, self._advance(token)))

    def _advance(self, token: int) -> str:
        if self.in_reasoning:
            if token == self.think_end_id:
                self.in_reasoning = False
            return ACCEPTED
        if not self.matcher.accept_token(token):
            return REJECTED
        return COMPLETE if self.matcher.is_terminated() else ACCEPTED


def token_bitmask(grammars: Sequence[RequestGrammar | None], vocab_size: int,
                  device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The allowed-token mask of a sampling batch, [B, ceil(V / 32)] int32 on `device` (kernels/sampling's packed
    form; unconstrained rows all ones), or None when no row is constrained (the sampler then skips masking).

    Filled on the host by xgrammar (its thread pool over the rows), in page-locked memory on CUDA so the copy to the
    device does not wait for the host; PyTorch's caching host allocator keeps the block until that copy is done."""
    rows = [i for i, g in enumerate(grammars) if g is not None and g.constrains_next]
    if not rows:
        return None
    global _batch_matcher
    import xgrammar as xgr

    if _batch_matcher is None:
        _batch_matcher = xgr.BatchGrammarMatcher()
    device = torch.device(device)
    mask = torch.full((len(grammars), -(-vocab_size // 32)), -1, dtype=torch.int32,
                      pin_memory=device.type == "cuda")
    _batch_matcher.batch_fill_next_token_bitmask([grammars[i].matcher for i in rows], mask, rows)
    return mask.to(device, non_blocking=True)
