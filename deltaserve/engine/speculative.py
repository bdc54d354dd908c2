"""Speculative decoding: draft k tokens, verify them in one target forward, keep the longest prefix the target agrees
with. The contract is exactness: a drafted reply is bit for bit the undrafted one, whatever the acceptance.

How a step of a drafting request goes (`SpeculativeDecoder.run`, the decode part of an engine step):
  1. verify: its newest token t and its drafts d_1 .. d_k as k + 1 decode rows of one forward
     (ForwardBatch.verify: each row has the logits of a one-token decode step at its position, bit for bit);
  2. sample every row as a decode step would (the pure function of logits, seed and position): s_0 .. s_k;
  3. accept: a = the number of leading drafts with d_{i+1} == s_i; the new tokens are s_0 .. s_a (s_a the
     "bonus" token the target samples after the last accepted draft). Every token is the target's own sample at its
     position from logits of a decode step's bits, so the reply is the undrafted one;
  4. commit: the DeltaNet state after the a + 1 kept rows (model.commit_verified); the K/V rows of rejected
     positions are simply written over by the next step (their blocks stay the request's: it grows into them);
  5. draft: the draft source sees the kept rows (the MTP head: the target's final-norm hidden states and the next
     tokens) and proposes the next k drafts.
Through a SpecGraph a step is only launched (`run` -> SpecPending) and read back by the engine's next step
(`finish`); where the same requests go on drafting, the engine launches the next step from that read-back before it
applies the tokens (`follow`), so the device does not wait for the host's bookkeeping.
Requests with penalties, a grammar or logprobs do not draft (their sampling state or outputs follow each token);
they still take one row of the verify forward, a decode step. A request's drafts never go past its last allowed token.

Draft sources: `MTPDrafter` (the checkpoint's own head, model/mtp.py); anything with `propose` (tests use one that
proposes the reply's own recorded tokens, right up to a chosen position).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from ..model.forward_batch import ForwardBatch
from . import multimodal
from .request import Request
from .sampler import Sampler, plain_sampling, uses_penalties
from .scheduler import ScheduledSeq
from .transfer import to_device

MAX_SPECULATIVE_TOKENS = 4
PROBE_STEPS = 8  # drafting steps a request makes before its acceptance may switch its drafting off
# Most rows a verify forward may have. Drafted replies equal undrafted ones on the H100 (Qwen3.6-35B-A3B q4 shapes,
# simulated acceptance 0.8) at 1, 4 and 8 streams (verify forwards of up to 16 rows), every row's logits bit for bit
# (lab/probe_spec_divergence.py --logits), since the MoE top-k's weights got one summation order in every launch;
# forwards of more rows (24 at 8 streams, k = 2; 192 at 64) differed before that fix and are not re-measured. Until
# they are, a verify forward keeps to 16 rows: its drafts are cut to fit (every kept token is still the target's
# own sample), and with more than 8 sequences decoding nobody drafts (a small-batch feature).
MAX_VERIFY_ROWS = 16


def drafts_that_fit(num_seqs: int) -> int:
    """Drafts each of num_seqs sequences may verify in one forward of at most MAX_VERIFY_ROWS rows."""
    return max(0, MAX_VERIFY_ROWS // max(num_seqs, 1) - 1)


def check_speculative_tokens(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"speculative_tokens must be an integer in 0..{MAX_SPECULATIVE_TOKENS}, found {k!r}")
    return k


@dataclass
class DraftRows:
    """What a draft source sees of one request after a forward: the pairs (h_i, t_{i+1}) for positions i = start ..
    start + n - 1, h the target's final-norm hidden state (what lm_head reads) and t the next token."""

    request: Request
    start: int
    next_tokens: torch.Tensor  # [n] int64, on the device
    hidden: torch.Tensor | None  # [n, H] (None where the source said it needs none)
    frontier: bool  # the last next token is the request's newest: a draft chain can start from it
    k: int = 0  # drafts wanted (0: only observe)


class DraftSource(Protocol):
    """Optional: `drafts_in_graph = True` says the source is the model's MTP head, which a SpecGraph then runs inside
    its step; a source wrapping it may define `override(rows, drafts) -> drafts` to replace those drafts."""

    needs_hidden: bool  # whether the engine must hand it the target's hidden states (prefill chunks included)

    def propose(self, rows: Sequence[DraftRows]) -> dict[str, list[int]]:
        """Take in the rows (in position order per request), and return up to row.k drafts for each frontier row
        (request_id -> draft ids)."""
        ...


class MTPDrafter:
    """The MTP head as the draft source: one pass over every request's new pairs (filling its KV at their
    positions), then k - 1 one-row steps from each frontier row (hidden := the previous step's output, spec 3.9).
    Drafts are the head's argmax: acceptance compares them with the target's own samples, so the output is exact
    whatever the drafts are. A SpecGraph runs the same head inside its step (drafts_in_graph, engine/spec_graph.py);
    `propose` serves the eager steps and the prompt's chunks."""

    needs_hidden = True
    drafts_in_graph = True

    def __init__(self, model, cache, block_size: int, device: torch.device, reserve_blocks=None):
        if getattr(model, "mtp", None) is None:
            raise ValueError("speculative decoding with the model's own draft head needs its MTP head: this model has "
                             "none (load the checkpoint with mtp=True; mlx-community conversions drop the head)")
        self.model, self.cache, self.block_size, self.device = model, cache, block_size, device
        self.reserve_blocks = reserve_blocks  # (request, tokens) -> None: blocks for the chain's KV rows

    @torch.inference_mode()
    def propose(self, rows: Sequence[DraftRows]) -> dict[str, list[int]]:
        if not rows:
            return {}
        flat, idx = 0, []
        for r in rows:
            flat += r.next_tokens.numel()
            if r.frontier and r.k > 0:
                idx.append((r, flat - 1))
        batch = ForwardBatch.build([[0] * r.next_tokens.numel() for r in rows], [r.start for r in rows],
                                   [r.request.block_table for r in rows], [r.request.state_slot for r in rows],
                                   self.block_size, device=self.device, logits=[i for _, i in idx] or [0])
        batch.input_ids = torch.cat([r.next_tokens for r in rows])
        logits, y = self.model.draft(batch, self.cache, torch.cat([r.hidden for r in rows]))
        if not idx:
            return {}
        chain = [(r, r.start + r.next_tokens.numel() - 1) for r, _ in idx]  # (request rows, last position q)
        ids = logits.argmax(-1)
        hidden = y[torch.tensor([i for _, i in idx], device=y.device)]
        drafts = [ids]
        for step in range(1, max(r.k for r, _ in chain)):
            live = [j for j, (r, _) in enumerate(chain) if r.k > step]
            if not live:
                break
            pick = torch.tensor(live, device=ids.device)
            for j in live:  # the chain's row at position q + step writes the MTP KV there
                r, q = chain[j]
                if self.reserve_blocks is not None:
                    self.reserve_blocks(r.request, q + step + 1)
            sub = ForwardBatch.build([[0]] * len(live), [chain[j][1] + step for j in live],
                                     [chain[j][0].request.block_table for j in live],
                                     [chain[j][0].request.state_slot for j in live], self.block_size,
                                     device=self.device)
            sub.input_ids = drafts[-1].index_select(0, pick)
            logits, y = self.model.draft(sub, self.cache, hidden.index_select(0, pick), step=step)
            full = torch.zeros_like(ids)
            full[pick] = logits.argmax(-1)
            drafts.append(full)
            hidden = hidden.clone()
            hidden[pick] = y
        table = torch.stack(drafts, 1).tolist()  # [F, steps]: the one read-back of the drafts
        return {r.request.request_id: table[j][: r.k] for j, (r, _) in enumerate(chain)}


@dataclass
class SpecStats:
    """The engine's totals: drafted and accepted tokens, verify steps (a drafting request's step)."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    switched_off: int = 0  # requests whose drafting was switched off for low acceptance

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafting step gave on average (accepted drafts + the target's own token)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


@dataclass
class SpecResult:
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request_id -> s_0 .. s_a


@dataclass
class SpecPending:
    """A drafting step launched through a SpecGraph and not yet read back (SpeculativeDecoder.finish)."""

    graph: object  # engine/spec_graph.SpecGraph
    seqs: list  # ScheduledSeq rows, in the graph's order
    kcaps: list[int]  # drafts each row verifies (the graph's k bounds them, and the next step's)
    result: SpecResult | None = None


class SpeculativeDecoder:
    """The decode part of a speculative engine step (see the module doc), for rows of one new token plus drafts:
    through a `SpecGraph` (engine/spec_graph.py) where one serves the rows, else eagerly."""

    def __init__(self, model, cache, sampler: Sampler, device: torch.device, k: int, source: DraftSource | None,
                 graphs=None, reserve=None, min_acceptance: float = 0.0):
        self.model, self.cache, self.sampler, self.device = model, cache, sampler, device
        self.k = check_speculative_tokens(k)
        self.min_acceptance = min_acceptance  # a request drafting worse than this stops drafting (see _count)
        self.source = source
        self.graphs = graphs  # engine/spec_graph.SpecGraphs, or None
        self.reserve = reserve  # (request, tokens) -> bool: grow its block table to cover tokens, if blocks allow
        self.stats = SpecStats()
        self.graph_steps = self.eager_steps = 0
        self.followed_steps = 0  # graph steps launched from the previous one's read-back (`follow`)

    def trim(self, seqs, graphs_ok: bool = False) -> None:
        """Cut the decode rows' drafts to what one verify forward of at most MAX_VERIFY_ROWS rows holds (the
        scheduled positions past the kept drafts are simply not verified). graphs_ok (the engine has step graphs): a
        drafting step runs through a step graph or not at all (an eager verify forward of a large model costs many
        times a graph step: on the H100 at 35B-A3B shapes 8 streams drafting eagerly ran at 0.03x of not drafting),
        so where none can serve the rows (no graph for their bucket, a row with a grammar or images, a table that
        cannot grow) no draft is left, and where one serves them the drafts are cut to its own (SpecGraphs.step_k).
        With no drafts left the step is a plain decode step, and those requests draft no more."""
        fit = drafts_that_fit(len(seqs))
        if graphs_ok and fit and any(s.request.draft_token_ids for s in seqs):
            fit = self.graphs.step_k(self.graphs.bucket(len(seqs))) if self._graph_can_serve(seqs) else 0
        for s in seqs:
            del s.request.draft_token_ids[fit:]

    def run(self, seqs, block_size: int, graphs_ok: bool = False) -> "SpecResult | SpecPending":
        """seqs: ScheduledSeq rows (start = the newest token's position, its token known on the host, the
        request's draft_token_ids its drafts, trimmed: `trim`). Verifies, samples, accepts, commits, drafts again.
        graphs_ok: the graphs may serve (captured on CUDA, or run eagerly in tests). Through a graph the step is
        only launched: a SpecPending, read back by `finish`; eagerly it is done: a SpecResult."""
        if any(s.request.num_pending for s in seqs):  # (the engine completes every drafting step before the next)
            raise RuntimeError("a drafting step's rows need their newest tokens on the host")
        if graphs_ok and self._graph_serves(seqs):
            reqs = [s.request for s in seqs]
            return self._launch_graph(seqs, [r.token_slice(s.start, s.start + 1)[0] for s, r in zip(seqs, reqs)],
                                      [r.num_tokens for r in reqs])
        self.eager_steps += 1
        reqs = [s.request for s in seqs]
        rows = [[r.token_slice(s.start, s.start + 1)[0]] + r.draft_token_ids for s, r in zip(seqs, reqs)]
        batch = ForwardBatch.build(rows, [s.start for s in seqs], [r.block_table for r in reqs],
                                   [r.state_slot for r in reqs], block_size, device=self.device, logits="all",
                                   verify=True)
        multimodal.apply_to_batch(batch, seqs)  # requests with images: their rope_delta-shifted positions
        logits, hidden = self.model.forward_with_hidden(batch, self.cache)
        flat_reqs = [r for r, row in zip(reqs, rows) for _ in row]
        positions = [r.num_tokens + i for r, row in zip(reqs, rows) for i in range(len(row))]
        ids = self.sampler.sample(logits, flat_reqs, positions)
        sampled = ids.tolist()  # the step's one read-back
        result, keep, observed, at = SpecResult(), [], [], 0
        for s, r, row in zip(seqs, reqs, rows):
            got = sampled[at: at + len(row)]
            a = 0
            while a < len(row) - 1 and row[a + 1] == got[a]:
                a += 1
            result.tokens[r.request_id] = got[: a + 1]
            keep.append(a + 1)
            self._count(r, len(row) - 1, a)
            observed.append((s, r, at, a))
            at += len(row)
        self.model.commit_verified(batch, self.cache, to_device(keep, torch.int64, self.device))
        self._draft_after_verify(observed, ids, hidden)
        return result

    def _count(self, r: Request, drafted: int, accepted: int) -> None:
        """Count a drafting step; after PROBE_STEPS of them, a request whose drafts were accepted less often than
        min_acceptance stops drafting for good (its steps become plain decode steps again: the same tokens)."""
        if drafted:
            self.stats.drafted += drafted
            self.stats.accepted += accepted
            self.stats.steps += 1
            m = r.metrics
            m.num_drafted += drafted
            m.num_accepted += accepted
            m.num_spec_steps += 1
            if m.num_spec_steps >= PROBE_STEPS and m.num_accepted < self.min_acceptance * m.num_drafted:
                r.drafting_off = True
                self.stats.switched_off += 1

    # ---- the graph path --------------------------------------------------------------------------------------
    def _graph_can_serve(self, seqs) -> bool:
        """Can a SpecGraph run these rows: a bucket holds them within the verify's row limit, no row has a grammar
        (its mask follows the previous token's matcher) or images, and its table's width covers everything the
        step may write (the verify's rows and the draft chain's). Rows with penalties or logprobs (which never
        draft: one real row) and top-k / top-p / min-p rows are sampled by the Sampler between the parts."""
        g = self.graphs
        bucket = g.bucket(len(seqs)) if g is not None else None
        if bucket is None or not g.rows_fit(bucket) or not g.fits_reach([s.start for s in seqs]):
            return False
        return not any(r.grammar is not None or r.mm is not None or r.logits_only for r in (s.request for s in seqs))

    def _graph_serves(self, seqs) -> bool:
        """_graph_can_serve with the drafts trimmed to the bucket's graph (trim), and every row's table grown to the
        step's reach (blocks allowing)."""
        if not self._graph_can_serve(seqs):
            return False
        k = self.graphs.step_k(self.graphs.bucket(len(seqs)))
        return (all(len(s.request.draft_token_ids) <= k for s in seqs)
                and all(self.reserve(s.request, self.graphs.reach(s.start)) for s in seqs))

    def _launch_graph(self, seqs, tokens: list[int], sample_at: list[int]) -> "SpecPending":
        """Launch a SpecGraph step of the rows (their tables already cover everything it may write): tokens[b] is
        row b's newest token, at cache index seqs[b].start; sample_at[b] the index its first row samples (the
        request's token count once that token is counted)."""
        from ..kernels.sampling import row_keys_host

        self.graph_steps += 1
        graphs = self.graphs
        reqs = [s.request for s in seqs]
        starts, slots = [s.start for s in seqs], [r.state_slot for r in reqs]
        g = graphs.graph(len(seqs), max(starts))
        k1 = g.k + 1  # (the bucket's drafts a sequence: SpecGraphs.step_k)
        graphs.sync_tables([r.block_table for r in reqs], slots, [r.slot_epoch for r in reqs])
        flat = [r for r in reqs for _ in range(k1)]
        positions = [n + i for n in sample_at for i in range(k1)]  # the index each row samples
        kcaps = [len(r.draft_token_ids) for r in reqs]
        graphs.load(g, tokens, starts, slots, kcaps, [r.draft_token_ids for r in reqs],
                    [r.params.temperature for r in flat], row_keys_host([r.seed for r in flat], positions))
        logits = g.run_verify()
        picked = sampler_rows(reqs, k1)
        if picked:  # the rows the graph does not sample itself: the Sampler's, between the parts
            at = torch.tensor(picked, dtype=torch.int64, device=logits.device)
            ids = self.sampler.sample(logits.index_select(0, at), [flat[j] for j in picked],
                                      [positions[j] for j in picked])
            g.sampled.index_copy_(0, at, ids)
        g.run_accept()
        return SpecPending(g, list(seqs), kcaps)

    def finish(self, step: "SpecPending") -> SpecResult:
        """Read a launched step back (once): each request's new tokens (s_0 .. s_a), its counts, and its next
        drafts (the head's from the graph, or the draft source's)."""
        if step.result is not None:
            return step.result
        k1 = step.graph.k + 1
        result, rows, drafted = SpecResult(), [], {}
        for s, kcap, line in zip(step.seqs, step.kcaps, step.graph.read(len(step.seqs))):
            r = s.request
            a = line[k1]
            tokens = line[: a + 1]
            result.tokens[r.request_id] = tokens
            if r.is_finished:  # aborted or stopped while the step ran: nothing of it counts
                continue
            self._count(r, kcap, a)
            k = min(drafts_allowed_after(r, self.k, a + 1), step.graph.k)
            rows.append(DraftRows(r, s.start, torch.tensor(tokens), None, frontier=True, k=k))
            drafted[r.request_id] = line[k1 + 1: k1 + 1 + k]
        step.result = result
        if self.source is None:
            return result
        if step.graph.draft:  # the head drafted in the graph; a source around it may replace them (the simulated bench)
            override = getattr(self.source, "override", None)
            drafts = override(rows, drafted) if override is not None else drafted
            for row in rows:
                row.request.draft_token_ids = list(drafts.get(row.request.request_id, []))[: row.k]
        else:
            self.propose(rows)
        return result

    @torch.inference_mode()
    def follow(self, step: "SpecPending", eos_ids=frozenset()) -> "SpecPending | None":
        """Launch the next drafting step of the same requests straight from a finished step's read-back, before the
        engine appends its tokens, so the device does not wait for the host's bookkeeping (detokenising, stops,
        outputs, scheduling): row b's newest token is its bonus token s_a at start + a + 1, its drafts the ones
        `finish` gave it. None where that step is not certain to be wanted or cannot run through the same kind of
        graph: a request whose tokens end it (max_tokens, an EOS or stop token id among them; a stop string is only
        found later, and its row is then dropped), no drafts at all (a plain decode step serves better), a table
        that cannot grow to the step's reach, or no captured graph for its bucket and width."""
        res = step.result
        if res is None:
            raise RuntimeError("follow: the step has not been read back (finish)")
        seqs, starts, tokens, sample_at = [], [], [], []
        for s in step.seqs:
            r = s.request
            new = res.tokens[r.request_id]
            ends = [t for t in new if t in r.params.stop_token_ids or (not r.params.ignore_eos and t in eos_ids)]
            if r.is_finished or r.drafting_off or r.num_outputs + len(new) >= r.max_tokens or ends:
                return None
            start = s.start + len(new)
            starts.append(start)
            tokens.append(new[-1])
            sample_at.append(r.num_tokens + len(new))
            seqs.append(ScheduledSeq(r, start, 1 + len(r.draft_token_ids), True, len(r.draft_token_ids)))
        if not any(s.num_drafts for s in seqs):
            return None
        if self.graphs.key(len(seqs), max(starts)) not in self.graphs.spec_graphs or not self._graph_serves(seqs):
            return None
        self.followed_steps += 1
        return self._launch_graph(seqs, tokens, sample_at)

    def _draft_after_verify(self, observed, ids: torch.Tensor, hidden: torch.Tensor) -> None:
        """The draft source sees each request's kept rows (h_{start+i}, s_i), i <= a, and proposes the next drafts."""
        if self.source is None:
            return
        rows, fit = [], drafts_that_fit(len(observed))
        for s, r, at, a in observed:
            k = min(drafts_allowed_after(r, self.k, a + 1), fit)
            h = hidden[at: at + a + 1] if self.source.needs_hidden else None
            rows.append(DraftRows(r, s.start, ids[at: at + a + 1], h, frontier=True, k=k))
        self.propose(rows)

    def observe_prompt(self, chunks: Sequence[tuple], ids_by_request: dict[str, torch.Tensor]) -> None:
        """After prompt chunks: chunks are (ScheduledSeq, hidden [n, H] or None); a chunk that sampled ends with
        the pair (h_{P-1}, its sampled token, ids_by_request[request_id] on the device)."""
        if self.source is None:
            return
        rows = []
        for s, h in chunks:
            r = s.request
            end = s.start + s.num_new_tokens
            nxt = r.prompt_token_ids[s.start + 1: end + 1] if end < r.num_prompt_tokens else r.prompt_token_ids[
                s.start + 1: end]
            tokens = to_device(nxt, torch.int64, self.device) if nxt else torch.empty(0, dtype=torch.int64,
                                                                                      device=self.device)
            frontier = end >= r.num_prompt_tokens and r.request_id in ids_by_request
            if frontier:
                tokens = torch.cat([tokens, ids_by_request[r.request_id].view(1)])
            if tokens.numel() == 0:
                continue
            n = tokens.numel()
            rows.append(DraftRows(r, s.start, tokens, None if h is None else h[:n], frontier,
                                  k=drafts_allowed_after(r, self.k, 1) if frontier else 0))
        self.propose(rows)

    def propose(self, rows: list[DraftRows]) -> None:
        drafts = self.source.propose(rows) if rows else {}
        for row in rows:
            if row.frontier:
                row.request.draft_token_ids = list(drafts.get(row.request.request_id, []))[: row.k]


def sampler_rows(reqs: Sequence[Request], rows_per_seq: int) -> list[int]:
    """The rows of a step graph's verify (request b's at b * rows_per_seq + i) that the engine's Sampler samples
    between the two parts instead of the graph's plain sampling: a request with penalties or logprobs its one row
    (it never drafts: its other rows are filler, which must not reach the penalties' token statistics), one with
    top-k / top-p / min-p all its rows."""
    out = []
    for b, r in enumerate(reqs):
        first = b * rows_per_seq
        if uses_penalties(r) or r.params.logprobs is not None:
            out.append(first)
        elif not plain_sampling(r.params):
            out.extend(range(first, first + rows_per_seq))
    return out


def drafts_allowed_after(req: Request, k: int, new_tokens: int) -> int:
    """Drafts the request may take once the step's new_tokens (not yet appended to it) are counted: none with
    penalties, a grammar or logprobs (their sampling state or outputs follow each token), none once its drafting
    is off (low acceptance), never past its last allowed token (the bonus token counts)."""
    if (uses_penalties(req) or req.grammar is not None or req.logits_only or req.params.logprobs is not None
            or req.drafting_off):
        return 0
    return max(0, min(k, req.max_tokens - req.num_outputs - new_tokens - 1))
