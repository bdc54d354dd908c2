"""The ChatML chat template written into tokenizer_config.json of synthetic checkpoints.

Rendered by jinja2 the way transformers' `apply_chat_template` renders it (variables: messages, tools,
add_generation_prompt, enable_thinking; filter `tojson`; function `raise_exception`). Output shapes (spec section 5):

  system turn      <|im_start|>system\n{system}\n\n# Tools ... <tools>\n{tool json per line}\n</tools> ...<|im_end|>\n
                   (tools declared in the system turn; without tools just the system content)
  each turn        <|im_start|>{role}\n{content}<|im_end|>\n
  images / videos  <|vision_start|><|image_pad|><|vision_end|>  /  <|vision_start|><|video_pad|><|vision_end|>
  tool calls       <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>
  tool results     one user turn per run of tool messages: <tool_response>\n{result}\n</tool_response> each
  reasoning        kept as <think>\n{reasoning}\n</think>\n\n only on assistant turns after the last user turn
  generation       <|im_start|>assistant\n<think>\n                   (thinking on)
                   <|im_start|>assistant\n<think>\n\n</think>\n\n     (enable_thinking=false)
"""

from __future__ import annotations

# Every tag strips surrounding whitespace ({%- -%}, {{- -}}) so the output does not depend on the
# trim_blocks / lstrip_blocks settings of the environment; all literal text is inside expressions.
_TEMPLATE = r"""
{%- macro render_content(content) -%}
  {%- if content is string -%}
    {{- content -}}
  {%- elif content is iterable and content is not mapping -%}
    {%- for part in content -%}
      {%- if part.type == 'image' or part.type == 'image_url' -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- elif part.type == 'video' -%}
        {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
      {%- elif part.type == 'text' -%}
        {{- part.text -}}
      {%- else -%}
        {{- raise_exception('unsupported content part type: ' ~ part.type) -}}
      {%- endif -%}
    {%- endfor -%}
  {%- elif content is not none and content is defined -%}
    {{- raise_exception('message content must be a string or a list of parts') -}}
  {%- endif -%}
{%- endmacro -%}

{%- if enable_thinking is defined and enable_thinking is not none -%}
  {%- set thinking = enable_thinking -%}
{%- else -%}
  {%- set thinking = THINKING_DEFAULT -%}
{%- endif -%}
{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}

{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if has_system -%}
    {{- render_content(messages[0].content) ~ '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nYou may call one or more of the following functions.\n\n<tools>' -}}
  {%- for tool in tools -%}
    {{- '\n' ~ (tool | tojson) -}}
  {%- endfor -%}
  {{- '\n</tools>\n\nTo call a function, answer with one block per call, in exactly this form:\n\n' -}}
  {{- '<tool_call>\n<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n' -}}
  {{- '</parameter>\n</function>\n</tool_call>' -}}
  {{- '<|im_end|>\n' -}}
{%- elif has_system -%}
  {{- '<|im_start|>system\n' ~ render_content(messages[0].content) ~ '<|im_end|>\n' -}}
{%- endif -%}

{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'user' -%}
    {%- set ns.last_user = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}

{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- if not loop.first -%}
      {{- '<|im_start|>system\n' ~ render_content(message.content) ~ '<|im_end|>\n' -}}
    {%- endif -%}
  {%- elif message.role == 'user' -%}
    {{- '<|im_start|>user\n' ~ render_content(message.content) ~ '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set content = render_content(message.content) -%}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is string -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
      {%- set content = content.split('</think>')[-1] -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if loop.index0 > ns.last_user and reasoning -%}
      {{- '<think>\n' ~ reasoning.strip('\n') ~ '\n</think>\n\n' -}}
    {%- endif -%}
    {{- content.lstrip('\n') -}}
    {%- if message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {%- if not loop.first -%}
          {{- '\n' -}}
        {%- elif content.strip() -%}
          {{- '\n\n' -}}
        {%- endif -%}
        {{- '<tool_call>\n<function=' ~ fn.name ~ '>\n' -}}
        {%- if fn.arguments is mapping -%}
          {%- for name, value in fn.arguments.items() -%}
            {{- '<parameter=' ~ name ~ '>\n' -}}
            {%- if value is string -%}
              {{- value -}}
            {%- else -%}
              {{- value | tojson -}}
            {%- endif -%}
            {{- '\n</parameter>\n' -}}
          {%- endfor -%}
        {%- elif fn.arguments is defined and fn.arguments is not none -%}
          {{- raise_exception('tool call arguments must be a mapping (parse the JSON string first)') -}}
        {%- endif -%}
        {{- '</function>\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' ~ render_content(message.content) ~ '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- raise_exception('unknown message role: ' ~ message.role) -}}
  {%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if thinking -%}
    {{- '<think>\n' -}}
  {%- else -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
"""


def chat_template(thinking_default: bool = True) -> str:
    """The template text; `thinking_default` is what a missing `enable_thinking` means."""
    return _TEMPLATE.strip().replace("THINKING_DEFAULT", "true" if thinking_default else "false")
