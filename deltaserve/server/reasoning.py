"""Reasoning / answer split of a Qwen3.5 reply, fed text as it streams.

With thinking on, the chat template's generation prompt already opens the block (`<|im_start|>assistant\n<think>\n`),
so the reply starts inside the reasoning and `</think>` ends it: `reasoning\n</think>\n\nanswer`. A reply may also
open the block itself (`<think>` as its very first text, for templates that leave that to the model).

The split of the whole text (`split_reasoning`) and the concatenation of the streamed pieces are the same whatever
the chunk boundaries: newlines that end the reasoning and newlines that start the answer belong to neither, and
anything that could still turn into a tag or into those newlines is held back until the next piece decides it.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def prompt_opens_reasoning(prompt: str) -> bool:
    """Does the rendered prompt end inside a <think> block (the reply starts as reasoning)?"""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """feed(text) -> (reasoning delta, answer delta); finish() -> the same for whatever was held back."""

    def __init__(self, in_reasoning: bool):
        self.state = "reasoning" if in_reasoning else "start"  # start -> (reasoning ->) answer
        self.buf = ""  # text not handed out yet
        self.strip_reasoning_newlines = False  # the newline after a <think> the reply wrote itself
        self.strip_answer_newlines = False

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = answer = ""
        if self.state == "start":
            lead = self.buf.lstrip()
            if lead.startswith(OPEN):
                self.buf, self.state, self.strip_reasoning_newlines = lead[len(OPEN):], "reasoning", True
            elif OPEN.startswith(lead):  # still possibly "<think>" (or nothing but whitespace yet)
                return "", ""
            else:
                self.state = "answer"
        if self.state == "reasoning":
            if self.strip_reasoning_newlines:
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return "", ""
                self.strip_reasoning_newlines = False
            i = self.buf.find(CLOSE)
            if i < 0:
                keep = _partial_tag(self.buf, CLOSE)
                body = self.buf[: len(self.buf) - keep]
                safe = len(body.rstrip("\n"))  # newlines right before </think> are not reasoning
                reasoning, self.buf = self.buf[:safe], self.buf[safe:]
                return reasoning, ""
            reasoning = self.buf[:i].rstrip("\n")
            self.buf, self.state, self.strip_answer_newlines = self.buf[i + len(CLOSE):], "answer", True
        if self.state == "answer":
            if self.strip_answer_newlines:
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return reasoning, ""
                self.strip_answer_newlines = False
            answer, self.buf = self.buf, ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """The end of the reply: held-back text goes out as what it was inside of."""
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            return rest, ""
        if self.state == "start":
            return "", rest
        return "", "" if self.strip_answer_newlines else rest


def split_reasoning(text: str, in_reasoning: bool) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply; equal to the concatenated feed()/finish() pieces of any split."""
    p = ReasoningParser(in_reasoning)
    r1, a1 = p.feed(text)
    r2, a2 = p.finish()
    return r1 + r2, a1 + a2
