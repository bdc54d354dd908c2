"""`deltaserve bench --engine --speculative-tokens`'s pieces on CPU with a tiny model with an MTP head: at simulated
acceptance 1.0 every draft is accepted, at 0.0 none, and the drafted replies equal the recorded undrafted ones."""

from __future__ import annotations

import pytest
import torch

from deltaserve.bench import engine_bench as eb
from deltaserve.bench import spec_bench as sb
from deltaserve.model import Qwen3_5ForCausalLM
from engine_helpers import tiny_config


@pytest.fixture(scope="module")
def model():
    model = Qwen3_5ForCausalLM(tiny_config(True), mtp_layers=1)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


@pytest.mark.parametrize("rate,k", [(1.0, 3), (0.0, 2), (0.7, 2)])
def test_simulated_acceptance_runs_exact(model, rate, k):
    vocab = model.config.vocab_size
    off = eb.decode_run(eb.make_engine(model, None, batch=2, max_len=sb.max_len(64, 9), caching=False), 2, 64, 9,
                        "default", vocab)
    r = sb.spec_run(model, None, 2, 64, 9, "default", vocab, k, rate, off["outputs"])
    assert r["exact"] and r["tokens"] == off["tokens"]
    if rate == 1.0:
        assert r["mean_acceptance_length"] > 2  # k + 1 but where max_tokens caps the drafts
    elif rate == 0.0:
        assert r["mean_acceptance_length"] == 1.0


def test_simulated_acceptance_through_the_step_graphs(model, monkeypatch):
    """The same through the drafting step graphs (engine/spec_graph.py, run eagerly on the CPU): the head runs inside
    the step and the simulation replaces its drafts (SimulatedAcceptance.override)."""
    real = sb.make_spec_engine

    def graphed(*args, **kw):
        engine = real(*args, cuda_graphs=True, **kw)
        engine.runner.graphs_off_device = True
        return engine

    monkeypatch.setattr(sb, "make_spec_engine", graphed)
    vocab = model.config.vocab_size
    off = eb.decode_run(eb.make_engine(model, None, batch=2, max_len=sb.max_len(64, 12), caching=False), 2, 64, 12,
                        "default", vocab)
    r = sb.spec_run(model, None, 2, 64, 12, "default", vocab, 2, 1.0, off["outputs"])
    assert r["exact"] and r["graph_steps"] > 0 and r["eager_steps"] == 0
    assert r["mean_acceptance_length"] > 2
