"""Speculative decoding through the engine (engine/speculative.py): drafted replies == undrafted ones, token for
token, greedy and seeded, whatever the acceptance (drafts that are the reply's own recorded tokens, right up to
position j for every j, all right, all wrong), in batches of mixed rows (penalties, which do not draft; different
lengths and max_tokens; stop token ids inside an accepted run), with aborts; and the MTP head as the draft source.
CPU, fp32 reference path (its verify is the decode steps themselves: model/qwen3_5._verify_reference)."""

from __future__ import annotations

import pytest
import torch

from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.model import Qwen3_5ForCausalLM
from engine_helpers import drain, random_prompt, tiny_config, tiny_model
from spec_helpers import RecordedDrafts

LENGTHS = [3, 17, 40, 5]


@pytest.fixture(scope="module")
def model():
    return tiny_model(moe=True, seed=3)


def params_for(kind: str, n: int, max_tokens: int = 14) -> list[SamplingParams]:
    if kind == "greedy":
        return [SamplingParams(temperature=0, max_tokens=max_tokens - i) for i in range(n)]
    return [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=100 + i, max_tokens=max_tokens - i)
            for i in range(n)]


def run(model, prompts, params, k=0, source=None, **cfg) -> tuple[list[list[int]], LLMEngine]:
    cfg = dict(dict(num_blocks=128, max_model_len=256, speculative_tokens=k), **cfg)
    engine = LLMEngine(model, None, [], EngineConfig(**cfg), draft_source=source)
    return drain(engine, prompts, params), engine


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_drafted_equals_undrafted_for_every_acceptance(model, kind, k):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    params = params_for(kind, len(prompts))
    want, _ = run(model, prompts, params)
    recorded = {str(i): t for i, t in enumerate(want)}
    for right in [None, *range(k)]:  # all right, then right up to position j (j = 0: all wrong)
        source = RecordedDrafts(recorded, model.config.vocab_size, right)
        got, engine = run(model, prompts, params, k, source)
        assert got == want, f"k={k}, drafts right up to {right}"
        stats = engine.spec_stats
        assert stats.drafted > 0 and source.proposed >= stats.drafted
        if right is None:
            assert stats.accepted == stats.drafted  # every draft the reply's own token: all accepted
        else:
            assert stats.accepted <= right * stats.steps
            assert stats.mean_acceptance_length <= right + 1


@pytest.mark.parametrize("graphs", [False, True])
def test_mixed_rows_stops_and_max_tokens_inside_an_accepted_run(model, graphs):
    """Penalties (no drafts), a stop token id met inside an accepted run, max_tokens reached inside one, beside
    plain drafting rows: each request's tokens as undrafted, and the stop / length reasons the same. Through the
    step graphs (graphs): drafting steps launched from the previous one's read-back (follow) included."""
    prompts = [random_prompt(n, seed=n + 7) for n in (6, 19, 33, 9)]
    base = [SamplingParams(temperature=0, max_tokens=20), SamplingParams(temperature=1.0, seed=4, max_tokens=20,
                                                                         repetition_penalty=1.3),
            SamplingParams(temperature=0.8, seed=9, max_tokens=7), SamplingParams(temperature=0, max_tokens=3)]
    want, _ = run(model, prompts, base)
    stop = want[0][5]  # a token of request 0's reply, met inside an accepted run of 4 drafts
    params = list(base)
    params[0] = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop])
    want, _ = run(model, prompts, params)
    assert want[0][-1] == stop and len(want[0]) <= 6
    source = RecordedDrafts({str(i): t for i, t in enumerate(want)}, model.config.vocab_size)
    engine = (graph_engine(model, 4, source) if graphs else
              LLMEngine(model, None, [], EngineConfig(num_blocks=128, max_model_len=256, speculative_tokens=4),
                        draft_source=source))
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert [finals[i].token_ids for i in ids] == want
    assert finals[ids[0]].finish_reason == "stop" and finals[ids[0]].stop_reason == stop
    assert finals[ids[3]].finish_reason == "length" and len(finals[ids[3]].token_ids) == 3
    m = finals[ids[1]].metrics
    assert m.num_drafted == 0 and m.mean_acceptance_length is None  # penalties: no drafts
    m = finals[ids[2]].metrics
    assert m.num_drafted > 0 and m.num_accepted == m.num_drafted and m.mean_acceptance_length > 1


@pytest.mark.parametrize("graphs", [False, True])
def test_abort_while_drafting(model, graphs):
    """A request aborted while drafting (through the graphs: while a step launched from the previous one's read-back
    computes for it): the other's reply as undrafted, the aborted one's a prefix of its own, every block back."""
    prompts = [random_prompt(n, seed=n + 3) for n in (8, 21)]
    params = params_for("greedy", 2, max_tokens=16)
    want, _ = run(model, prompts, params)
    source = RecordedDrafts({str(i): t for i, t in enumerate(want)}, model.config.vocab_size, right=2)
    engine = (graph_engine(model, 3, source) if graphs else
              LLMEngine(model, None, [], EngineConfig(num_blocks=128, max_model_len=256, speculative_tokens=3),
                        draft_source=source))
    a, b = (engine.add_request(p, sp) for p, sp in zip(prompts, params))
    got = {a: [], b: []}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
        steps += 1
        if steps == 3:
            assert not graphs or engine._drafting is not None  # (a follower in flight, computing for a too)
            engine.abort(a)
    assert got[b] == want[1] and got[a] == want[0][: len(got[a])] and len(got[a]) < len(want[0])
    assert engine.scheduler.blocks.num_free == engine.scheduler.blocks.num_blocks
    assert engine.scheduler.blocks.num_free == engine.num_blocks  # every block back


@pytest.fixture(scope="module")
def mtp_model():
    """The tiny MoE with an MTP head (random weights)."""
    model = Qwen3_5ForCausalLM(tiny_config(True), mtp_layers=1)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.5 if ("embed_tokens" in name or "lm_head" in name or "mlp.gate." in name) else 0.2
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_mtp_head_drafts_replies_equal_undrafted(mtp_model, kind):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    params = params_for(kind, len(prompts))
    want, _ = run(mtp_model, prompts, params)
    got, engine = run(mtp_model, prompts, params, 2, max_num_batched_tokens=32)  # chunked prompts feed the head too
    assert got == want
    assert engine.spec_stats.drafted > 0 and engine.cache.k.keys() > set(mtp_model.config.full_attention_layers)


def test_speculative_tokens_checked_and_a_headless_model_refused(model):
    with pytest.raises(ValueError, match="speculative_tokens must be an integer in 0..4"):
        LLMEngine(model, None, [], EngineConfig(num_blocks=64, max_model_len=128, speculative_tokens=5))
    with pytest.raises(ValueError, match="needs the model's MTP head"):
        LLMEngine(model, None, [], EngineConfig(num_blocks=64, max_model_len=128, speculative_tokens=2))
    with pytest.raises(ValueError, match="speculative_tokens must be an integer"):
        LLM.from_model(model, num_blocks=64, max_model_len=128, speculative_tokens=-1)


@pytest.mark.parametrize("graphs", [False, True])
def test_stop_string_inside_an_accepted_run(model, graphs):
    """A stop string completed by a token inside an accepted run of drafts: the same text, tokens and stop reason as
    undrafted (the byte tokenizer: one token a byte); through the graphs the next drafting step was already launched
    for the stopped request (follow: a stop string is only found when the tokens are appended), its row dropped."""
    from engine_helpers import byte_tokenizer

    tok = byte_tokenizer()
    prompt = random_prompt(12, seed=41)
    plain = SamplingParams(temperature=0, max_tokens=16)
    want, _ = run(model, [prompt], [plain])
    text = tok.decode(want[0][:6])
    pick = next(j for j in range(2, 6) if want[0][j] < 128 and chr(want[0][j]) not in tok.decode(want[0][:j]))
    params = SamplingParams(temperature=0, max_tokens=16, stop=[chr(want[0][pick])])

    def final(k, source=None):
        engine = (graph_engine(model, k, source, tok, num_blocks=64, max_model_len=128) if graphs and k else
                  LLMEngine(model, tok, [], EngineConfig(num_blocks=64, max_model_len=128, speculative_tokens=k),
                            draft_source=source))
        engine.add_request(prompt, params)
        last = None
        while engine.has_unfinished():
            for out in engine.step():
                last = out
        return last

    off = final(0)
    on = final(4, RecordedDrafts({"0": want[0]}, model.config.vocab_size))
    assert (on.token_ids, on.text, on.finish_reason, on.stop_reason) == (off.token_ids, off.text, off.finish_reason,
                                                                        off.stop_reason)
    assert off.finish_reason == "stop" and len(off.token_ids) == pick + 1 and text.startswith(off.text)


# ---- the graph path (engine/spec_graph.py), run eagerly on the CPU (graphs_off_device) ---------------------------
def graph_engine(model, k, source=None, tokenizer=None, **cfg):
    cfg = dict(dict(num_blocks=128, max_model_len=256, speculative_tokens=k, cuda_graphs=True), **cfg)
    engine = LLMEngine(model, tokenizer, [], EngineConfig(**cfg), draft_source=source)
    engine.runner.graphs_off_device = True
    return engine


@pytest.mark.parametrize("kind", ["greedy", "seeded"])  # seeded: top-k / top-p rows sampled between the two parts
@pytest.mark.parametrize("k", [1, 3])
def test_graph_steps_equal_undrafted_for_every_acceptance(model, kind, k):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    params = params_for(kind, len(prompts))
    want, _ = run(model, prompts, params)
    recorded = {str(i): t for i, t in enumerate(want)}
    for right in [None, *range(k)]:
        engine = graph_engine(model, k, RecordedDrafts(recorded, model.config.vocab_size, right))
        assert drain(engine, prompts, params) == want, f"k={k}, drafts right up to {right}"
        assert engine.spec.graph_steps > 0 and engine.spec.eager_steps == 0
        assert engine.spec.followed_steps > 0  # steps launched from the previous one's read-back
        stats = engine.spec_stats
        if right is None:
            assert stats.accepted == stats.drafted > 0
        else:
            assert stats.accepted <= right * stats.steps


def test_rows_sampled_by_the_sampler_share_the_step_graphs(model):
    """Requests the graph does not sample itself beside drafting ones, in the same step graphs: penalties and
    logprobs (one row each, no drafts, sampled by the Sampler between the parts: their filler rows never reach the
    penalties' statistics) and top-k / top-p (all their rows). No eager step; every reply as undrafted, its
    logprobs one a token."""
    prompts = [random_prompt(n, seed=n + 7) for n in (6, 19, 33, 12)]
    params = [SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=1.0, seed=4, max_tokens=9,
                                                                           repetition_penalty=1.3),
              SamplingParams(temperature=0.8, seed=9, max_tokens=20, top_k=20, top_p=0.9),
              SamplingParams(temperature=0, max_tokens=12, logprobs=2)]

    def finals(engine):
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        done = {}
        while engine.has_unfinished():
            done.update({o.request_id: o for o in engine.step() if o.finished})
        return [done[i] for i in ids]

    want = finals(LLMEngine(model, None, [], EngineConfig(num_blocks=128, max_model_len=256)))
    recorded = {str(i): o.token_ids for i, o in enumerate(want)}
    engine = graph_engine(model, 3, RecordedDrafts(recorded, model.config.vocab_size, 2))
    got = finals(engine)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    # logprobs: one entry a token, the same candidates; their values as close as a batch's logits allow on the CPU
    # (the reference path's logits are not batch invariant in their last bits: a request alone vs among others)
    assert len(got[3].logprobs) == len(want[3].logprobs) == len(want[3].token_ids)
    for g, w in zip(got[3].logprobs, want[3].logprobs):
        assert g.keys() == w.keys() and all(abs(g[t].logprob - w[t].logprob) < 1e-4 for t in g)
    assert engine.spec.graph_steps > 0 and engine.spec.eager_steps == 0
    assert got[1].metrics.num_drafted == got[3].metrics.num_drafted == 0
    assert got[0].metrics.num_drafted > 0 and got[2].metrics.num_drafted > 0


class ForcedHead:
    """The MTP head as the draft source (its drafts logged), each draft then replaced by the recorded reply's token,
    kept right up to a position drawn per (request, step) from a fixed hash, so the acceptance varies from 0 to k;
    the same on the eager path (propose) and in the graph (override)."""

    needs_hidden = True
    drafts_in_graph = True

    def __init__(self, inner, recorded, vocab):
        self.inner, self.recorded, self.vocab = inner, recorded, vocab
        self.head = []  # (request id, output index, the head's drafts)

    def _forced(self, rows, head):
        from deltaserve.bench.spec_bench import recorded_drafts

        out = {}
        for row in rows:
            if row.frontier and row.k:
                o = row.start + row.next_tokens.numel() - row.request.num_prompt_tokens
                self.head.append((row.request.request_id, o, head.get(row.request.request_id, [])[: row.k]))
                right = (o * 7 + int(row.request.request_id) * 3) % (row.k + 1)
                out.update(recorded_drafts([row], self.recorded, self.vocab, lambda i: i < right))
        return out

    def propose(self, rows):
        return self._forced(rows, self.inner.propose(rows))

    def override(self, rows, drafts):
        return self._forced(rows, drafts)


@pytest.mark.parametrize("k", [2, 3])  # (4 sequences of k + 1 rows: within MAX_VERIFY_ROWS)
def test_graph_head_drafts_equal_the_eager_head(mtp_model, k):
    """The head run inside the graph (a fixed-shape pass over all k + 1 rows, then the chain from row a) drafts what
    the eager MTPDrafter drafts from the kept rows, at every acceptance length; replies as undrafted."""
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    params = params_for("greedy", len(prompts), max_tokens=18)
    want, _ = run(mtp_model, prompts, params)
    recorded = {str(i): t for i, t in enumerate(want)}
    logs = []
    for graphs in (False, True):
        engine = (graph_engine if graphs else lambda m, k: LLMEngine(m, None, [], EngineConfig(
            num_blocks=128, max_model_len=256, speculative_tokens=k)))(mtp_model, k)
        engine.spec.source = ForcedHead(engine.spec.source, recorded, mtp_model.config.vocab_size)
        assert drain(engine, prompts, params) == want
        assert (engine.spec.graph_steps > 0, engine.spec.eager_steps > 0) == (graphs, not graphs)
        assert 0 < engine.spec_stats.accepted < engine.spec_stats.drafted
        logs.append(sorted(engine.spec.source.head))
    assert logs[0] == logs[1] and len(logs[0]) > 10


def drain_ahead(engine, prompts, params) -> tuple[list, int]:
    """Every request's final output, in order, and how many steps left one in flight (one step ahead)."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    finals, ahead = {}, 0
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
        ahead += engine._in_flight is not None
    return [finals[i] for i in ids], ahead


def test_a_request_arriving_while_steps_follow_each_other(model):
    """Drafting steps launched from the previous one's read-back (follow) stop when a request arrives (it must be
    scheduled), and start again once it drafts too; every reply as undrafted, the late one's as if alone."""
    prompts = [random_prompt(n, seed=n + 11) for n in (7, 26)]
    params = params_for("greedy", 2, max_tokens=24)
    want, _ = run(model, prompts, params)
    recorded = {str(i): t for i, t in enumerate(want)}
    engine = graph_engine(model, 2, RecordedDrafts(recorded, model.config.vocab_size, right=1))
    first = engine.add_request(prompts[0], params[0])
    got, steps, late = {first: []}, 0, None
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
        steps += 1
        if steps == 4:
            assert engine._drafting is not None and engine.spec.followed_steps > 0
            followed = engine.spec.followed_steps
            late = engine.add_request(prompts[1], params[1])
            got[late] = []
            for out in engine.step():
                got[out.request_id] += out.new_token_ids
            assert engine.spec.followed_steps == followed  # the step after the arrival was scheduled, not followed
    assert [got[first], got[late]] == want and engine.spec.followed_steps > followed
    assert engine.scheduler.blocks.num_free == engine.scheduler.blocks.num_blocks


def test_steps_follow_each_other_while_requests_queue_for_a_slot(model):
    """With every sequence slot taken (max_num_seqs 1), a queued request cannot be scheduled, so the drafting steps
    of the running one still follow each other; the queued one runs after it; both replies as undrafted."""
    prompts = [random_prompt(n, seed=n + 21) for n in (9, 14)]
    params = params_for("greedy", 2, max_tokens=20)
    want, _ = run(model, prompts, params)
    engine = graph_engine(model, 2, RecordedDrafts({str(i): t for i, t in enumerate(want)}, model.config.vocab_size,
                                                   right=1), max_num_seqs=1)
    seen = []  # (a request waiting, steps followed so far) after each step
    got = drain(engine, prompts, params,
                on_step=lambda e: seen.append((bool(e.scheduler.waiting), e.spec.followed_steps)))
    assert got == want
    while_waiting = [f for w, f in seen if w]
    assert while_waiting and while_waiting[-1] - while_waiting[0] >= 3  # the first one's steps followed meanwhile


@pytest.mark.parametrize("graphs", [False, True])
def test_drafting_switches_itself_off_at_low_acceptance(model, graphs):
    """Drafts never right: after PROBE_STEPS drafting steps each request stops drafting and decodes plainly (through
    the decode graphs, one step ahead, where there are graphs); the replies stay the undrafted ones. With
    speculative_min_acceptance = 0 it drafts to the end."""
    from deltaserve.engine.speculative import PROBE_STEPS

    prompts = [random_prompt(n, seed=n) for n in (5, 23)]
    params = params_for("greedy", 2, max_tokens=30)
    want, _ = run(model, prompts, params)
    recorded = {str(i): t for i, t in enumerate(want)}
    for floor in (0.25, 0.0):
        source = RecordedDrafts(recorded, model.config.vocab_size, right=0)
        engine = graph_engine(model, 2, source, cuda_graphs=graphs, speculative_min_acceptance=floor)
        finals, ahead = drain_ahead(engine, prompts, params)
        assert [f.token_ids for f in finals] == want
        steps = [f.metrics.num_spec_steps for f in finals]
        if floor:
            assert steps == [PROBE_STEPS] * 2 and engine.spec_stats.switched_off == 2
            assert ahead >= 10 and (engine.runner.graph_steps > 0) == graphs  # plain steps, one ahead
        else:  # (its last token or two have no room for drafts: plain steps)
            assert min(steps) > PROBE_STEPS and engine.spec_stats.switched_off == 0 and ahead <= 2


def test_verify_forwards_keep_to_max_verify_rows(model):
    """Drafts are cut so that a verify forward has at most MAX_VERIFY_ROWS rows (some GPU kernels are chosen by row
    count, and a row's bits must not change with it): 6 sequences verify 1 draft each (12 rows), 17 none; a step
    graph verifies what its bucket's rows allow (bucket 8: one draft each), never more. Replies as undrafted."""
    from deltaserve.engine.speculative import MAX_VERIFY_ROWS, drafts_that_fit

    assert [drafts_that_fit(n) for n in (1, 2, 4, 5, 8, 9, 16, 17)] == [15, 7, 3, 2, 1, 0, 0, 0]
    prompts = [random_prompt(n, seed=n + 1) for n in (3, 9, 14, 20, 6, 11)]
    params = params_for("greedy", len(prompts), max_tokens=10)
    want, _ = run(model, prompts, params)
    recorded = {str(i): t for i, t in enumerate(want)}
    for graphs in (False, True):
        engine = graph_engine(model, 4, RecordedDrafts(recorded, model.config.vocab_size), cuda_graphs=graphs)
        seen = []
        real = model.forward_with_hidden

        def spy(batch, cache, real=real):
            if batch.verify:
                seen.append(batch.num_tokens)
            return real(batch, cache)

        engine.spec.model = type("Spy", (), {"__getattr__": lambda self, n: getattr(model, n),
                                             "forward_with_hidden": staticmethod(spy)})()
        assert drain(engine, prompts, params) == want
        if graphs:  # a bucket's graph verifies the drafts its rows allow: 6 sequences -> bucket 8, one draft each
            shapes = {(g.batch, g.k) for g in engine.spec.graphs.spec_graphs.values()}
            assert (8, 1) in shapes and max(b * (k + 1) for b, k in shapes) <= MAX_VERIFY_ROWS
            assert engine.spec.graph_steps > 0 and engine.spec.eager_steps == 0
        else:  # eagerly: 6 sequences -> one draft each (12 rows)
            assert seen and max(seen) <= MAX_VERIFY_ROWS and max(seen) > len(prompts)
            assert engine.spec.eager_steps > 0
        assert engine.spec_stats.drafted > 0


def test_more_sequences_than_verify_rows_decode_plainly(model):
    """17 sequences decoding together cannot verify a draft each within MAX_VERIFY_ROWS: their steps are plain
    decode steps (one step ahead), nothing is drafted, and the replies are the undrafted ones."""
    prompts = [random_prompt(4 + i, seed=50 + i) for i in range(17)]
    params = [SamplingParams(temperature=0, max_tokens=6)] * 17
    want, _ = run(model, prompts, params, max_num_seqs=17, num_blocks=256)
    engine = graph_engine(model, 2, RecordedDrafts({str(i): t for i, t in enumerate(want)}, model.config.vocab_size),
                          max_num_seqs=17, num_blocks=256)
    finals, ahead = drain_ahead(engine, prompts, params)
    assert [f.token_ids for f in finals] == want
    assert engine.spec_stats.drafted == 0 and engine.spec.graph_steps == engine.spec.eager_steps == 0 and ahead > 0


@pytest.mark.parametrize("source_kind", ["recorded", "mtp"])
def test_drafting_over_prefix_cache_resumes(model, mtp_model, source_kind):
    """A multi-turn conversation whose later turns resume from the prefix cache (KV blocks and DeltaNet snapshots
    at aligned positions), drafting on: every turn's reply equals the undrafted engine's, the turns after the first
    resumed from cached tokens, and drafts were made (recorded drafts all right; or the MTP head, whose own KV for the
    cached positions comes from the turn that wrote them)."""
    net = model if source_kind == "recorded" else mtp_model
    cfg = dict(num_blocks=160, max_model_len=1024, block_size=16, max_num_batched_tokens=128, max_num_seqs=4,
               enable_prefix_caching=True, prefix_snapshot_interval=128)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def conversation(k: int, source=None) -> tuple[list[list[int]], LLMEngine]:
        engine = LLMEngine(net, None, [], EngineConfig(speculative_tokens=k, **cfg), draft_source=source)
        history, replies = random_prompt(150, seed=21), []
        for turn in range(3):
            reply = drain(engine, [history], [sp])[0]
            replies.append(reply)
            history = history + reply + random_prompt(40 + 30 * turn, seed=30 + turn)
        return replies, engine

    want, _ = conversation(0)
    source = None
    if source_kind == "recorded":
        # the reply's own tokens as drafts: request ids are the engine's (0, 1, 2 in turn order)
        source = RecordedDrafts({str(i): r for i, r in enumerate(want)}, net.config.vocab_size)
    got, engine = conversation(2, source)
    assert got == want
    assert engine.prefix_cache.hits > 0, "no turn resumed from the prefix cache"
    assert engine.spec_stats.drafted > 0
    if source_kind == "recorded":
        assert engine.spec_stats.accepted == engine.spec_stats.drafted
