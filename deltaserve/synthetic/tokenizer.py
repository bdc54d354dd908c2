"""Tokenizer files of a synthetic checkpoint: tokenizer.json, tokenizer_config.json, generation_config.json.

The tokenizer has the published Qwen3.5 shape (spec section 5): byte-level BPE, NFC normaliser, the Qwen3.5
split regex (letter runs include combining marks), no BOS, and the 26 added tokens of `presets.SPECIAL_TOKENS`
directly after the ordinary vocabulary. Its merges are learned deterministically by the `tokenizers` BPE trainer
from `TRAINING_TEXT` below (a real vocabulary is not available offline); the ordinary vocabulary is then padded
with never-produced filler entries up to the preset's `bpe_size`, so the added tokens land at the published ids
(248044..248069) for the real-shape presets and right after 1000 entries for the tiny ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .chat_template import chat_template
from .presets import SPECIAL_TOKENS, Preset

# The Qwen3.5 pre-tokeniser split: contractions, [\p{L}\p{M}]+ words with one optional leading non-letter,
# single digits, punctuation runs (with trailing newlines), newline runs, whitespace.
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TRAINED_MERGES_TARGET = 1000  # vocabulary size asked of the trainer (256 byte symbols + merges)

# Short mixed text (prose, chat, code, numbers, a little non-ASCII) for the BPE trainer. Any change to it
# changes every synthetic tokenizer, hence every tiny checkpoint's token ids.
TRAINING_TEXT = """\
The engine serves hybrid language models. Three of every four layers are linear attention layers that keep a
small recurrent state per sequence; every fourth layer is full attention with a paged key-value cache. The state
of a linear layer does not grow with the length of the conversation, so long contexts stay cheap.

A request arrives, the scheduler decides which tokens run in the next step, the runner executes the model,
and the sampler picks the next token. Prefill processes the prompt; decode produces one token at a time.
When the same prompt prefix was seen before, the cached blocks are reused and only the new tokens are computed.

User: What is the capital of France?
Assistant: The capital of France is Paris. It is known for the Eiffel Tower, the Louvre, and its cafés.
User: Can you write a short poem about the sea?
Assistant: The sea is wide, the sea is deep, it sings the shore to sleep. Waves return, the tide will keep.
User: Please think step by step. If a train leaves at 9:45 and arrives at 13:20, how long is the trip?
Assistant: From 9:45 to 13:45 is 4 hours; 13:20 is 25 minutes earlier, so the trip takes 3 hours 35 minutes.

def softplus(x, threshold=20.0):
    # numerically stable: log(1 + exp(x)) for small x, x itself for large x
    if x > threshold:
        return x
    return math.log1p(math.exp(x))

for layer in range(num_layers):
    hidden = hidden + attention(norm(hidden), cache=cache, positions=positions)
    hidden = hidden + mlp(norm(hidden))
print(f"logits shape: {logits.shape}, max = {logits.max().item():.4f}")

{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius", "days": 3}}
{"name": "search", "arguments": {"query": "gated delta rule", "limit": 10, "offset": 0}}
The results were 0.125, 3.14159, 2.71828, 1e-6, 262144 and 248320; the answer is 42.

Numbers, dates and units: 2024-05-17, 12:30:00, 1.5 GB/s, 80%, $19.99, 3 x 4 = 12, 7 + 8 = 15, 100 - 1 = 99.
Quote: "Simple things should be simple, complex things should be possible." (Alan Kay)
Other scripts: naïve coöperation, Straße, Ελληνικά, русский язык, 中文文本, 日本語のテキスト, 한국어.
The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the sun while the fox runs away.
We test, we measure, we compare; the numbers tell us whether the change made the system faster or slower.
Tokens are pieces of words: the tokenizer splits text into pieces, and the model predicts the next piece.
Weather report: tomorrow morning will be cloudy with light rain; the afternoon brings sunshine and a warm breeze.
Recipe: mix two cups of flour, one egg, a pinch of salt and warm milk; bake for twenty minutes until golden.
"""


def _filler(i: int) -> str:
    return f"<|filler_{i}|>"


def train_bpe(bpe_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer with exactly `bpe_size` ordinary entries and the added tokens after them."""
    if bpe_size < 256:
        raise ValueError(f"bpe_size {bpe_size} is smaller than the 256-symbol byte alphabet")
    tok = _empty_tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    trainer = trainers.BpeTrainer(
        vocab_size=min(bpe_size, TRAINED_MERGES_TARGET),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    # Pad the ordinary vocabulary with fillers the merges never produce, so added tokens start at bpe_size.
    for i in range(len(vocab), bpe_size):
        vocab[_filler(i)] = i
    tok = _empty_tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    for content, special in SPECIAL_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    for i, (content, _) in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(content) != bpe_size + i:
            raise RuntimeError(f"added token {content!r} got id {tok.token_to_id(content)}, expected {bpe_size + i}")
    return tok


def _empty_tokenizer(model: models.BPE) -> Tokenizer:
    tok = Tokenizer(model)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_config(preset: Preset) -> dict:
    """tokenizer_config.json: added tokens, eos <|im_end|>, pad <|endoftext|>, no BOS, the chat template."""
    decoder = {
        str(preset.bpe_size + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, special in SPECIAL_TOKENS if special and c != "<|endoftext|>"],
        "bos_token": None,
        "chat_template": chat_template(preset.thinking_default),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer_files(out_dir: str | Path, preset: Preset) -> list[Path]:
    """Writes tokenizer.json, tokenizer_config.json and generation_config.json; returns their paths."""
    out = Path(out_dir)
    tok = train_bpe(preset.bpe_size)
    paths = [out / "tokenizer.json", out / "tokenizer_config.json", out / "generation_config.json"]
    tok.save(str(paths[0]), pretty=False)
    paths[1].write_text(json.dumps(tokenizer_config(preset), indent=2, ensure_ascii=False) + "\n")
    paths[2].write_text(json.dumps(preset.generation, indent=2) + "\n")
    return paths
