"""Incremental detokenisation and stop-string matching for one request.

Byte-level BPE pieces can split a UTF-8 character across tokens: decoding a prefix then shows U+FFFD. We keep two
offsets into the token list (the vLLM/TGI scheme): `prefix` (start of a short window already turned into text)
and `read` (end of that window). Each new token decodes tokens[prefix:] and emits only what extends the window's
text, and only once it no longer ends in U+FFFD, so no character is ever emitted half-formed.

Stop strings are matched on the text. While a request runs, the last (longest stop string - 1) characters are
held back from the stream, because they may be the start of a stop string; so the streamed text always equals the
final text's prefix.
"""

from __future__ import annotations

from typing import Sequence

from tokenizers import Tokenizer

# Prompt tokens decoded in front of the output, so that the first output token is decoded in context.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop)
        self.include_stop = include_stop_str_in_output
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix = 0
        self.read = len(self.tokens)
        self.text = ""  # the output text so far (after a stop match: cut at the stop string)
        self.streamed = 0  # characters of self.text already handed out

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int) -> str | None:
        """Append one output token; returns the stop string if the text now contains one (text cut there)."""
        self.tokens.append(token_id)
        window = self._decode(self.tokens[self.prefix : self.read])
        full = self._decode(self.tokens[self.prefix :])
        if len(full) <= len(window) or full.endswith(_REPLACEMENT):
            return None  # incomplete character (or nothing visible yet): wait for more tokens
        before = len(self.text)
        self.text += full[len(window) :]
        self.prefix, self.read = self.read, len(self.tokens)
        return self._match_stop(before)

    def flush(self) -> None:
        """At the end of a request: emit whatever is still pending, even an incomplete character (as U+FFFD)."""
        if self.read < len(self.tokens):
            window = self._decode(self.tokens[self.prefix : self.read])
            full = self._decode(self.tokens[self.prefix :])
            if len(full) > len(window):
                self.text += full[len(window) :]
            self.prefix, self.read = self.read, len(self.tokens)

    def _match_stop(self, before: int) -> str | None:
        if not self.stop:
            return None
        lo = max(0, before - self.holdback)  # a stop string may straddle the old end of the text
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, lo)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        self.text = self.text[: i + (len(s) if self.include_stop else 0)]
        return s

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out: all of it when finished, else all but the held-back tail."""
        end = len(self.text) if finished else max(self.streamed, len(self.text) - self.holdback)
        delta = self.text[self.streamed : end]
        self.streamed = end
        return delta
