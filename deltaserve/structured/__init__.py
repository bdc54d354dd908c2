"""Structured output: replies constrained to a JSON schema, a regex, a choice, an EBNF grammar or forced tool calls.

  params.py          StructuredOutputsParams (vLLM's `structured_outputs` spelling; GuidedDecodingParams alias)
  schema_check.py    JSON Schema keywords the grammar cannot enforce, refused with their location
  compiler.py        spec -> xgrammar grammar: parsed at add_request, compiled on a worker thread, LRU-cached
  matcher.py         a request's matcher and reasoning gate; the batch's packed allowed-token mask
  tool_calls.py      tool_choice "required" / a named function -> the Qwen XML tool-call structural tag
  openai_request.py  OpenAI / vLLM request fields (response_format, tool_choice, guided_*) -> params (the server)

The grammar library is xgrammar (what vLLM and SGLang use by default); it is imported only when a request asks for a
constraint. The engine's side (holding a request until its grammar is compiled, advancing the matcher, ending on a
dead end) is engine/structured.py; the mask is applied by kernels/sampling.apply_allowed_mask.
"""

from .params import GuidedDecodingParams, StructuredOutputsError, StructuredOutputsParams

__all__ = ["GuidedDecodingParams", "StructuredOutputsError", "StructuredOutputsParams"]
