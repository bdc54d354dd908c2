"""The engine's host work per decode step does not grow with the context (issue: O(new tokens), not O(context)):
counted, not timed. Two requests decode the same number of steps at contexts of 60 and 1,200 tokens through the
graph runner (its eager replay on the CPU); per decode step, the token ids read from the request, the block-table
entries uploaded and the output's token list built are the same for both, up to the one block a row gains every
block_size tokens."""

from __future__ import annotations

from engine_helpers import random_prompt, tiny_model
from deltaserve.engine import request as request_mod
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams


def decode_costs(model, prompt_len: int, steps: int, monkeypatch) -> list[tuple[int, int]]:
    engine = LLMEngine(model, None, [], EngineConfig(num_blocks=200, block_size=16, max_model_len=2048,
                                                      max_num_batched_tokens=2048, cuda_graphs=True))
    engine.runner.graphs_off_device = True
    counts = {"tokens": 0, "table": 0}
    real_slice = request_mod.Request.token_slice

    def slice_(self, start, end):
        counts["tokens"] += end - start
        return real_slice(self, start, end)

    monkeypatch.setattr(request_mod.Request, "token_slice", slice_)
    graphs = engine.runner.graphs
    real_sync = graphs.sync_tables

    def sync(tables, slots, epochs=None):
        before = list(graphs._table_len)
        real_sync(tables, slots, epochs)
        counts["table"] += sum(max(a - b, 0) for a, b in zip(graphs._table_len, before))

    graphs.sync_tables = sync
    engine.add_request(random_prompt(prompt_len, seed=1), SamplingParams(temperature=0, max_tokens=steps + 1,
                                                                          ignore_eos=True))
    engine.step()  # the prompt's chunk(s)
    while engine.scheduler.running[0].in_prefill:
        engine.step()
    per_step = []
    while engine.has_unfinished():
        counts["tokens"] = counts["table"] = 0
        outs = engine.step()
        per_step.append((counts["tokens"], counts["table"]))
        for o in outs:
            assert len(o.new_token_ids) == 1
            assert o.finished or callable(o._token_ids)  # the whole-output list is built only when asked for
    return per_step


def test_decode_host_work_does_not_grow_with_the_context(monkeypatch):
    model = tiny_model(moe=True, seed=1)
    short = decode_costs(model, 60, 24, monkeypatch)
    long = decode_costs(model, 1200, 24, monkeypatch)
    assert len(short) == len(long) >= 20
    # a decode row's input token: read from the request (0 when still pending on the device, 1 otherwise)
    assert max(t for t, _ in short) <= 1 and max(t for t, _ in long) <= 1
    # table entries uploaded: the first decode step uploads the table once; after it, one block at a time
    assert all(b <= 1 for _, b in short[2:]) and all(b <= 1 for _, b in long[2:])
    assert abs(sum(b for _, b in long[2:]) - sum(b for _, b in short[2:])) <= 1
