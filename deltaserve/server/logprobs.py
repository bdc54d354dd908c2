"""The engine's per-token log-probabilities (RequestOutput.logprobs: {token_id: Logprob(logprob, rank)} per output
token, from the raw logits) in OpenAI's two shapes: chat's `logprobs.content` entries and completions' parallel
lists. A token's text is its own decoding (a token that holds part of a UTF-8 character shows U+FFFD, and its
`bytes` are that text's)."""

from __future__ import annotations

from typing import Sequence

from tokenizers import Tokenizer

from ..engine.outputs import Logprob, RequestOutput


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer, top: int):
        self.tokenizer = tokenizer
        self.top = top  # the most likely tokens listed per position

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _ranked(self, d: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
        return sorted(d.items(), key=lambda kv: kv[1].rank)[: self.top]

    def chat_entries(self, token_ids: Sequence[int], lps: Sequence[dict[int, Logprob]]) -> list[dict]:
        out = []
        for t, d in zip(token_ids, lps):
            entry = self._chat_token(t, d[t].logprob)
            entry["top_logprobs"] = [self._chat_token(tid, lp.logprob) for tid, lp in self._ranked(d)]
            out.append(entry)
        return out

    def _chat_token(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def completion(self, token_ids: Sequence[int], lps: Sequence[dict[int, Logprob]], offset: int = 0) -> dict:
        """{"tokens", "token_logprobs", "top_logprobs", "text_offset"}; offsets count from `offset` characters."""
        tokens = [self.token(t) for t in token_ids]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": [d[t].logprob for t, d in zip(token_ids, lps)],
                "top_logprobs": [{self.token(tid): lp.logprob for tid, lp in self._ranked(d)} for d in lps],
                "text_offset": offsets}


def new_logprobs(out: RequestOutput) -> tuple[list[int], list[dict[int, Logprob]]]:
    """This output's new tokens and their log-probabilities (the engine's list covers the whole output so far)."""
    n = len(out.new_token_ids)
    if not n or out.logprobs is None:
        return [], []
    return list(out.new_token_ids), list(out.logprobs[-n:])
