"""Speculative decoding through the engine on CUDA: drafted replies == undrafted ones, token for token, greedy and
seeded, in batches of mixed rows, for every acceptance (the reply's own recorded tokens as drafts, right up to each
position), on the bf16 fast path and on a q4 model with its MTP head drafting; the undrafted engine runs its
default way (decode graphs, one step ahead), the drafting one through its step graphs (engine/spec_graph.py) and
eagerly (docs/speculative.md).

Run on the H200: `pytest -m gpu tests/gpu/test_speculative_gpu.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.synthetic import make_checkpoint
from deltaserve.synthetic.presets import get_preset
from deltaserve.synthetic.quantized import write_quantized_synthetic
from deltaserve.weights.loader import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent.parent))
from engine_helpers import drain, random_prompt  # noqa: E402
from spec_helpers import RecordedDrafts  # noqa: E402

pytestmark = pytest.mark.gpu
LENGTHS = [3, 17, 70, 5, 130, 9]


@pytest.fixture(scope="module")
def bf16_model(bf16_moe_model):
    return bf16_moe_model


@pytest.fixture(scope="module", params=["bf16", "q4"])
def mtp_model(request, tmp_path_factory):
    """The synthetic tiny MoE with its MTP head, bf16 (HF layout) or q4 (MLX layout, the head kept)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "bf16":
        make_checkpoint(path, "tiny-moe", seed=2, progress=False)
    else:  # expert widths of one q4 g64 group and 8 DeltaNet value heads: the shapes the q4 fast paths serve
        wide = get_preset("tiny-moe")
        wide.config["text_config"].update(moe_intermediate_size=64, shared_expert_intermediate_size=64,
                                          linear_num_value_heads=8)
        write_quantized_synthetic(path, wide, "q4", seed=2, progress=False)
    return load_checkpoint(path, device="cuda", dtype=torch.bfloat16, progress=False, mtp=True).model


def params_for(kind: str, n: int) -> list[SamplingParams]:
    if kind == "greedy":
        return [SamplingParams(temperature=0, max_tokens=24 - i) for i in range(n)]
    out = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=24 - i) for i in range(n)]
    out[1] = SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=20)  # the sampler's full path
    out[2] = SamplingParams(temperature=1.0, seed=4, max_tokens=20, repetition_penalty=1.2)  # no drafts
    return out


def run(model, prompts, params, k=0, source=None, max_num_seqs=8, graphs=True) -> tuple[list[list[int]], LLMEngine]:
    cfg = EngineConfig(num_blocks=256, max_model_len=512, max_num_seqs=max_num_seqs, speculative_tokens=k,
                       cuda_graphs=graphs)
    engine = LLMEngine(model, None, [], cfg, draft_source=source)
    out = drain(engine, prompts, params)
    if k:  # the drafting steps went the way asked (the penalised request's steps run eagerly in both)
        assert (engine.spec.graph_steps > 0) == graphs
    return out, engine


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("max_num_seqs", [1, 8])  # the batch-1 deployment (one row a step) and a throughput one
@pytest.mark.parametrize("graphs", [True, False])
def test_recorded_drafts_equal_undrafted(bf16_model, kind, k, max_num_seqs, graphs):
    prompts = [random_prompt(n, seed=n, vocab=bf16_model.config.vocab_size) for n in LENGTHS]
    params = params_for(kind, len(prompts))
    want, _ = run(bf16_model, prompts, params, max_num_seqs=max_num_seqs)
    recorded = {str(i): t for i, t in enumerate(want)}
    for right in [None, *range(k)]:
        source = RecordedDrafts(recorded, bf16_model.config.vocab_size, right)
        got, engine = run(bf16_model, prompts, params, k, source, max_num_seqs=max_num_seqs, graphs=graphs)
        assert got == want, f"k={k}, drafts right up to {right}"
        if right is None:
            assert engine.spec_stats.accepted == engine.spec_stats.drafted > 0


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_mtp_head_drafts_equal_undrafted(mtp_model, kind):
    prompts = [random_prompt(n, seed=n, vocab=mtp_model.config.vocab_size) for n in LENGTHS]
    params = params_for(kind, len(prompts))
    want, _ = run(mtp_model, prompts, params)
    # (k = 4 with two sequences at a time: a step graph's rows keep to speculative.MAX_VERIFY_ROWS, 2 x 5)
    for k, seqs in ((1, 8), (2, 8), (4, 2)):
        for graphs in (True, False):
            got, engine = run(mtp_model, prompts, params, k, graphs=graphs, max_num_seqs=seqs)
            assert got == want, f"k={k}, graphs {graphs}"
            assert engine.spec_stats.drafted > 0
