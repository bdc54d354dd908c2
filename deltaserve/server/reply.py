"""One chat choice's text -> OpenAI message parts: reasoning, answer content and tool calls, streamed or whole.

The reasoning split comes first (a <tool_call> inside the reasoning is reasoning); the answer then goes through the
tool-call parser when the request declared tools. Streaming (`feed` per delta, `finish` at the end) and the whole
message (`parse_reply`) share the code, so the streamed deltas always add up to the non-streamed message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .reasoning import ReasoningParser
from .tool_calls import ToolCall, ToolCallParser


@dataclass
class ReplyDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def add(self, other: "ReplyDelta") -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls += other.tool_calls


class ReplyParser:
    def __init__(self, starts_in_reasoning: bool, tools: Sequence[dict] | None):
        self.reasoning = ReasoningParser(starts_in_reasoning)
        self.tools = ToolCallParser(tools) if tools else None

    @property
    def num_tool_calls(self) -> int:
        return self.tools.calls if self.tools is not None else 0

    def feed(self, text: str) -> ReplyDelta:
        reasoning, answer = self.reasoning.feed(text)
        return self._answer(reasoning, answer, final=False)

    def finish(self) -> ReplyDelta:
        reasoning, answer = self.reasoning.finish()
        return self._answer(reasoning, answer, final=True)

    def _answer(self, reasoning: str, answer: str, final: bool) -> ReplyDelta:
        if self.tools is None:
            return ReplyDelta(reasoning, answer)
        content, calls = self.tools.feed(answer)
        if final:
            more, late = self.tools.finish()
            content, calls = content + more, calls + late
        return ReplyDelta(reasoning, content, calls)


def parse_reply(text: str, starts_in_reasoning: bool, tools: Sequence[dict] | None) -> ReplyDelta:
    parser = ReplyParser(starts_in_reasoning, tools)
    whole = parser.feed(text)
    whole.add(parser.finish())
    return whole
