"""Synthetic tokenizer files: special-token ids, round trips, transformers loading, the ChatML chat template."""

from __future__ import annotations

import json

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from deltaserve.model.config import ModelConfig
from deltaserve.synthetic.chat_template import chat_template
from deltaserve.synthetic.presets import PRESETS, PUBLISHED_BPE_SIZE, SPECIAL_TOKENS, TINY_BPE_SIZE, get_preset
from deltaserve.synthetic.tokenizer import train_bpe, write_tokenizer_files

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world! The engine serves hybrid models.",
    "  leading spaces, trailing spaces   \n\n\ttabs and\r\nwindows newlines\n",
    "def f(x):\n    return x ** 2  # 3.14159, 1e-6, 262144\n",
    "naïve café Straße Ελληνικά русский 中文文本 日本語 한국어 emoji 🙂👍🏽",
    "e\u0301 combining mark (NFC turns it into é), ﬁ ligature stays",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nreasoning\n</think>\n\n<tool_call>\n</tool_call>",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_tok")
    write_tokenizer_files(out, get_preset("tiny-moe"))
    return out


@pytest.fixture(scope="module")
def published_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("published_tok")
    write_tokenizer_files(out, get_preset("qwen3.6-35b-a3b"))
    return out


@pytest.fixture(scope="module")
def hf_tiny(tiny_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


# ---- ids -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which, base", [("tiny_dir", TINY_BPE_SIZE), ("published_dir", PUBLISHED_BPE_SIZE)])
def test_special_tokens_at_their_ids(which, base, request):
    path = request.getfixturevalue(which)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    hf = transformers.AutoTokenizer.from_pretrained(path)
    assert raw.get_vocab_size(with_added_tokens=False) == base
    assert len(hf) == base + 26
    for i, (token, _) in enumerate(SPECIAL_TOKENS):
        assert raw.token_to_id(token) == base + i
        assert hf.convert_tokens_to_ids(token) == base + i
        assert raw.encode(token).ids == [base + i]  # never split by BPE
    if base == PUBLISHED_BPE_SIZE:  # the confirmed published anchors (spec section 5)
        anchors = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053,
                   "<|vision_end|>": 248054, "<|image_pad|>": 248056, "<|video_pad|>": 248057, "<tool_call>": 248058,
                   "</tool_call>": 248059, "<think>": 248068, "</think>": 248069}  # fmt: skip
        assert {t: hf.convert_tokens_to_ids(t) for t in anchors} == anchors
    assert hf.eos_token == "<|im_end|>" and hf.eos_token_id == base + 2
    assert hf.pad_token == "<|endoftext|>" and hf.pad_token_id == base
    assert hf.bos_token is None


def test_config_and_generation_ids_agree_with_tokenizer():
    for name, preset in PRESETS.items():
        ids = preset.special_ids
        cfg = ModelConfig.from_dict(preset.config)
        assert cfg.vocab_size >= preset.bpe_size + len(SPECIAL_TOKENS), name
        if cfg.vision_config is not None:
            assert cfg.image_token_id == ids["<|image_pad|>"] and cfg.video_token_id == ids["<|video_pad|>"]
            assert cfg.vision_start_token_id == ids["<|vision_start|>"]
            assert cfg.vision_end_token_id == ids["<|vision_end|>"]
        assert set(cfg.eos_token_ids) <= {ids["<|endoftext|>"], ids["<|im_end|>"]}, name
        assert preset.generation["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]], name
        assert preset.generation["pad_token_id"] == ids["<|endoftext|>"], name


def test_special_flags(tiny_dir, hf_tiny):
    """Control tokens are special (dropped by skip_special_tokens); tool/think tags and FIM tokens are not."""
    ids = hf_tiny("<|im_start|>a<think>b</think><tool_call>c</tool_call><|im_end|>")["input_ids"]
    assert hf_tiny.decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c</tool_call>"
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    flags = {v["content"]: v["special"] for v in config["added_tokens_decoder"].values()}
    assert flags == dict(SPECIAL_TOKENS)


# ---- encoding ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_and_transformers_agree(tiny_dir, hf_tiny, text):
    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    ids = raw.encode(text).ids
    assert hf_tiny(text)["input_ids"] == ids  # transformers uses our tokenizer.json as is
    normalised = text.replace("e\u0301", "é")  # NFC normaliser
    assert raw.decode(ids, skip_special_tokens=False) == normalised
    assert hf_tiny.decode(ids) == normalised


def test_pretokenizer_rules():
    tok = train_bpe(TINY_BPE_SIZE)
    digits = tok.encode("2024").tokens
    assert digits == ["2", "0", "2", "4"]  # single digits
    assert not tok.encode("hi").ids[0] == tok.token_to_id("<|endoftext|>")  # no BOS prepended
    assert tok.encode("The engine").tokens == ["The", "Ġengine"]  # trained merges: whole common words, space-led


def test_tokenizer_is_deterministic(tmp_path):
    assert train_bpe(TINY_BPE_SIZE).to_str() == train_bpe(TINY_BPE_SIZE).to_str()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for out in (a, b):
        write_tokenizer_files(out, get_preset("tiny-dense"))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_published_vocab_padding_is_never_produced(published_dir):
    raw = Tokenizer.from_file(str(published_dir / "tokenizer.json"))
    tiny = train_bpe(TINY_BPE_SIZE)
    for text in TEXTS:  # same merges as the tiny tokenizer; fillers never appear
        ids = raw.encode(text).ids
        assert all(i < TINY_BPE_SIZE or i >= PUBLISHED_BPE_SIZE for i in ids)
        shifted = [i if i < TINY_BPE_SIZE else i - PUBLISHED_BPE_SIZE + TINY_BPE_SIZE for i in ids]
        assert shifted == tiny.encode(text).ids


# ---- chat template ---------------------------------------------------------------------------------------------


def render_like_transformers(template: str, messages, tools=None, add_generation_prompt=False, **kwargs) -> str:
    """Plain jinja2 configured the way transformers renders chat templates (sandbox, trim/lstrip blocks,
    loopcontrols, a non-sorting non-escaping tojson, raise_exception)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )


USER = [{"role": "user", "content": "Hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <today> & tomorrow",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}
        ],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": "21 C"},
    {"role": "assistant", "content": "<think>\nIt is sunny.\n</think>\n\nSunny, 21 C."},
]


def test_generation_prompt_thinking_on_off_exact(hf_tiny):
    on = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n"
    off = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    render = hf_tiny.apply_chat_template
    assert render(USER, tokenize=False, add_generation_prompt=True, enable_thinking=True) == on
    assert render(USER, tokenize=False, add_generation_prompt=True, enable_thinking=False) == off
    assert render(USER, tokenize=False, add_generation_prompt=True) == on  # tiny presets think by default
    assert render(USER, tokenize=False, add_generation_prompt=False) == "<|im_start|>user\nHello<|im_end|>\n"
    template = hf_tiny.chat_template
    assert render_like_transformers(template, USER, add_generation_prompt=True, enable_thinking=False) == off
    assert render_like_transformers(template, USER, add_generation_prompt=True) == on


def test_small_model_template_defaults_to_no_thinking():
    template = chat_template(get_preset("qwen3.5-0.8b").thinking_default)
    assert render_like_transformers(template, USER, add_generation_prompt=True).endswith("<think>\n\n</think>\n\n")
    assert render_like_transformers(template, USER, add_generation_prompt=True, enable_thinking=True).endswith(
        "assistant\n<think>\n"
    )


def test_system_turn_and_chatml_turns(hf_tiny):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]  # fmt: skip
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    )
    assert hf_tiny.apply_chat_template(messages, tokenize=False) == expected
    ids = hf_tiny.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert ids[0] == hf_tiny.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(hf_tiny.convert_tokens_to_ids("<|im_end|>")) == 4


def test_tools_tool_calls_and_responses(hf_tiny):
    text = hf_tiny.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=False)
    tool_json = json.dumps(TOOLS[0], ensure_ascii=False)
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n\n")
    assert f"<tools>\n{tool_json}\n</tools>" in text and text.count("<|im_start|>system") == 1
    call = (
        "<|im_start|>assistant\n<think>\nI should call the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call>"
        "<|im_end|>\n"
    )
    assert call in text
    responses = (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n21 C\n</tool_response>"
        "<|im_end|>\n"
    )
    assert responses in text
    assert text.endswith("<|im_start|>assistant\n<think>\nIt is sunny.\n</think>\n\nSunny, 21 C.<|im_end|>\n")
    assert render_like_transformers(hf_tiny.chat_template, CONVERSATION, tools=TOOLS) == text


def test_reasoning_dropped_before_last_user_turn(hf_tiny):
    messages = [{"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "A1", "reasoning_content": "old thoughts"},
                {"role": "user", "content": "Q2"}]  # fmt: skip
    text = hf_tiny.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "old thoughts" not in text
    assert "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n" in text


def test_images_and_videos_render_as_vision_placeholders(hf_tiny):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"},
                                             {"type": "video"}]}]  # fmt: skip
    expected = (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?"
        "<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n"
    )
    assert render_like_transformers(hf_tiny.chat_template, messages) == expected
    assert hf_tiny.apply_chat_template(messages, tokenize=False) == expected


def test_template_rejects_bad_input(hf_tiny):
    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown message role: robot"):
        render_like_transformers(hf_tiny.chat_template, [{"role": "robot", "content": "x"}])
    bad_call = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="tool call arguments must be a mapping"):
        render_like_transformers(hf_tiny.chat_template, bad_call)
