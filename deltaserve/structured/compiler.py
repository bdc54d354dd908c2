"""Grammar compilation for one tokenizer: parse at add_request (bad specs refused there), compile in a worker thread,
keep the compiled grammars in an LRU keyed by the spec text (a repeated schema is compiled once).

Two stages, because they fail and cost differently:
  parse    spec -> xgrammar.Grammar: JSON schema / regex / EBNF / structural tag conversion; fast (ms), and where every
           bad spec fails, so it runs synchronously and its error reaches the caller of add_request;
  compile  Grammar -> CompiledGrammar: the per-tokenizer token-mask tables (the costly part on a 248K vocabulary);
           runs on a worker thread, and the request waits for it outside the scheduler (engine/structured.py).

The vocabulary xgrammar sees (`token_strings`): every token id below the model's vocab_size, as the byte-level string
the tokenizer stores. Added tokens flagged special (<|im_end|>, <|endoftext|>, the vision tokens, ...) and ids past
the tokenizer's vocabulary (the embedding's padding rows) are given the empty string, which xgrammar never allows as
text, so they are masked everywhere except the end-of-sequence ids, which the grammar allows exactly where it is
complete. Plain added tokens (<tool_call>, <think>, ...) keep their text, so a grammar that spells "<tool_call>" can be
met by that one token.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

from tokenizers import Tokenizer

from .params import StructuredOutputsError, StructuredOutputsParams
from .schema_check import check_schema

DEFAULT_CACHE_SIZE = 128  # compiled grammars kept; a 248K-vocabulary JSON schema grammar is ~1 MB or less


def token_strings(tokenizer: Tokenizer, vocab_size: int) -> list[str]:
    """Encoded (byte-level) text of every id in [0, vocab_size); "" for special tokens and padding ids."""
    strings = [""] * vocab_size
    for text, i in tokenizer.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            strings[i] = text
    for i, added in tokenizer.get_added_tokens_decoder().items():
        if added.special and i < vocab_size:
            strings[i] = ""
    return strings


def check_byte_level(tokenizer: Tokenizer) -> None:
    """The vocabulary strings are read as byte-level BPE (GPT-2 / Qwen): refuse any other tokenizer clearly."""
    if type(tokenizer.decoder).__name__ != "ByteLevel":
        raise StructuredOutputsError("structured outputs need a byte-level BPE tokenizer (the Qwen3.5 kind); this "
                                     f"tokenizer's decoder is {type(tokenizer.decoder).__name__}")


def _clean(error: Exception) -> str:
    """xgrammar's C++ messages without their '[time] file.cc:line: ' and 'Check failed: ... is false: ' prefixes."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text)
    return re.sub(r"^Check failed: \(.*?\) is false: ", "", text)


def _ebnf_literal(text: str) -> str:
    """A string literal of xgrammar's EBNF (JSON escapes are understood by its parser)."""
    return json.dumps(text, ensure_ascii=False)


def parse(params: StructuredOutputsParams) -> Any:
    """The xgrammar.Grammar for `params`; raises StructuredOutputsError naming the field and the problem."""
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            try:
                schema = json.loads(params.json)
            except json.JSONDecodeError as e:
                raise StructuredOutputsError(f"structured_outputs.json is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise StructuredOutputsError(
                    f"structured_outputs.json must be a JSON schema (an object), found {type(schema).__name__}")
            check_schema(schema)
            return xgr.Grammar.from_json_schema(params.json, any_whitespace=not params.disable_any_whitespace)
        if kind == "json_object":
            if params.disable_any_whitespace:
                return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
            return xgr.Grammar.from_json_schema('{"type": "object"}')
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_ebnf_literal(c) for c in params.choice))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(params.grammar)
        try:
            json.loads(params.structural_tag)
        except json.JSONDecodeError as e:
            raise StructuredOutputsError(f"structured_outputs.structural_tag is not valid JSON: {e}") from None
        return xgr.Grammar.from_structural_tag(params.structural_tag)
    except StructuredOutputsError:
        raise
    except Exception as e:  # xgrammar raises RuntimeError / ValueError / pydantic errors with the reason
        raise StructuredOutputsError(f"structured_outputs.{kind}: {_clean(e)}") from None


class GrammarCompiler:
    """Compiles grammars for one (tokenizer, model vocab_size, stop ids); thread-safe; one per engine.

    `submit(params)` parses now (raising on a bad spec) and returns a Future of the CompiledGrammar: the cached one
    when the same spec was seen (even while it is still compiling), otherwise a fresh compile on the worker pool."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int],
                 cache_size: int = DEFAULT_CACHE_SIZE, max_workers: int = 1):
        check_byte_level(tokenizer)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = [t for t in stop_token_ids if 0 <= t < vocab_size]
        if not self.stop_token_ids:
            raise StructuredOutputsError("structured outputs need an end-of-sequence token id (the grammar allows it "
                                         "where the reply is complete); the model and tokenizer declare none")
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache
        self._build_lock = threading.Lock()  # guards the one-time xgrammar compiler build
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._xgr_compiler = None  # built on first compile (the vocabulary scan takes ~1 s at 248K tokens)
        self.compiled = 0  # grammars compiled (cache misses), for tests and logs

    def submit(self, params: StructuredOutputsParams) -> Future:
        key = params.cache_key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        grammar = parse(params)  # outside the lock: a slow parse must not stall other submitters
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                return hit
            future = self._pool.submit(self._compile, grammar)
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)  # holders of an evicted future keep it alive
        future.add_done_callback(lambda f, k=key: self._forget_failure(k, f))
        return future

    def _forget_failure(self, key: tuple, future: Future) -> None:
        if future.exception() is not None:
            with self._lock:
                if self._cache.get(key) is future:
                    del self._cache[key]

    def _compile(self, grammar: Any) -> Any:
        self.compiled += 1
        return self.xgr_compiler().compile_grammar(grammar)

    def xgr_compiler(self) -> Any:
        """The xgrammar.GrammarCompiler over this vocabulary (built once; its own cache off: ours is the LRU)."""
        with self._build_lock:
            if self._xgr_compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo(token_strings(self.tokenizer, self.vocab_size), xgr.VocabType.BYTE_LEVEL,
                                         vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids)
                self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._xgr_compiler

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
