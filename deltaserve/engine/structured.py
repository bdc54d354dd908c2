"""The engine's side of structured output: attach a grammar at add_request, hold the request outside the scheduler
while its grammar compiles, release it once compiled (or end it if the compile failed), and feed the matchers the
previous step's tokens before a step samples.

The hooks in engine.py: add_request -> attach (+ hold); step -> release, wait when only held requests remain, and
`catch_up` handed to runner.launch; _append_token -> RequestGrammar.accept (a rejected token ends the request:
finish_reason "stop", stop_reason GRAMMAR_DEAD_END; an end-of-sequence token the grammar accepts ends it as "stop"
even with ignore_eos). The sampler asks structured.matcher.token_bitmask for its rows' mask.

One step ahead: the engine launches step n+1 before it reads step n back, but a constrained row's mask at n+1 depends
on its token at n. So when step n+1 samples a constrained row, the runner calls `catch_up`'s callback once its
forward is launched: it waits for step n's ids (which the device computed before this forward) and feeds them to the
matchers (RequestGrammar.accept_ahead); the mask is then filled on the host while the forward runs, and step n's
read-back later finds those verdicts (accept). Unconstrained steps never wait there.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from typing import Callable, Sequence

from tokenizers import Tokenizer

from ..structured.compiler import GrammarCompiler
from ..structured.matcher import RequestGrammar
from ..structured.params import StructuredOutputsError
from .request import Request
from .runner import StepHandle
from .sampling_params import SamplingParamsError
from .scheduler import Scheduler, SchedulerOutput

GRAMMAR_DEAD_END = "grammar_dead_end"  # stop_reason of a request whose grammar allowed no next token
THINK_END = "</think>"


class StructuredOutputs:
    """Per engine: the grammar compiler (built at the first constrained request) and the requests still compiling."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, eos_token_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        self.held: list[Request] = []  # arrival order; not in the scheduler until their grammar is compiled

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._compiler

    def attach(self, req: Request) -> None:
        """Parse req's grammar now (a bad spec raises SamplingParamsError naming it) and start compiling it."""
        so = req.params.structured_outputs
        if self.tokenizer is None:
            raise SamplingParamsError("SamplingParams.structured_outputs needs a tokenizer (the grammar is matched "
                                      "on the tokens' text)")
        if req.logits_only:
            raise SamplingParamsError("SamplingParams.structured_outputs does not apply to a logits request")
        think_end = None
        if so.after_think:
            think_end = self.tokenizer.token_to_id(THINK_END)
            if think_end is None:
                raise SamplingParamsError(f"structured_outputs.after_think: the tokenizer has no {THINK_END} token")
        try:
            req.grammar = RequestGrammar(self.compiler.submit(so), think_end)
        except StructuredOutputsError as e:
            raise SamplingParamsError(f"SamplingParams.{e}") from None

    def hold(self, req: Request) -> None:
        self.held.append(req)

    @property
    def holding(self) -> bool:
        return bool(self.held)

    def release(self, scheduler: Scheduler) -> list[tuple[Request, str]]:
        """Hand the held requests whose grammar is compiled to the scheduler (in arrival order); return those whose
        compile failed, with the reason, for the engine to end. Aborted (finished) requests are dropped."""
        failed, still = [], []
        for req in self.held:
            if req.is_finished:
                continue
            if not req.grammar.ready:
                still.append(req)
            elif req.grammar.error() is not None:
                failed.append((req, f"grammar compile failed: {req.grammar.error()}"))
            else:
                scheduler.add(req)
        self.held = still
        return failed

    def catch_up(self, out: SchedulerOutput,
                 in_flight: tuple[SchedulerOutput, StepHandle] | None) -> Callable[[], None] | None:
        """For a step about to launch while `in_flight` (the previous one) is not read back: if it samples a
        constrained row whose previous token is still pending, a callback that reads the previous step's ids and
        feeds them to its live requests' matchers (the runner calls it after launching the forward, before
        sampling); else None (the step runs fully ahead)."""
        if in_flight is None or not any(s.sample and s.request.grammar is not None and s.request.num_pending
                                        for s in out.seqs):
            return None
        previous, handle = in_flight

        def feed() -> None:
            sampled = handle.result().sampled
            for s in previous.seqs:
                r = s.request
                if s.sample and r.grammar is not None and not r.is_finished and r.request_id in sampled:
                    r.grammar.accept_ahead(sampled[r.request_id])

        return feed

    def wait(self, timeout: float | None = None) -> None:
        """Block until at least one held request's grammar is compiled (the engine has nothing else to run)."""
        pending = [r.grammar.compiled for r in self.held if not r.grammar.ready]
        if pending:
            wait_futures(pending, timeout=timeout, return_when=FIRST_COMPLETED)
