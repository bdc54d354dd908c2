"""The engine's bucketed CUDA-graph decode (EngineConfig.cuda_graphs) on the GPU: same tokens as the eager engine.

Run on the H200: `pytest -m gpu tests/gpu/test_engine_graph_gpu.py`. CUDA only: the engine's prefill runs fla's
chunked kernels, which have no interpreter path (tests/test_engine_graph.py covers the graph runner's logic on CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from deltaserve.engine.cuda_graph import bucket_for
from deltaserve.engine.engine import EngineConfig, LLMEngine
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.weights.loader import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent.parent))
from model_helpers import bf16_exact_moe_checkpoint, make_hf_model, ours_from_checkpoint  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["bf16", "q4-mma-moe"])
def model(request, tmp_path_factory):
    """A tiny MoE checkpoint loaded in bf16 on the GPU: the fast path. "bf16": fused layout, bf16-exact weights.
    "q4-mma-moe": quantised to q4 g64 with expert widths of 64, on the tensor-core MoE (the plan's default: every
    MoE block, decode and prefill, on the tensor-core kernels over the repacked experts)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the engine's prefill needs fla's GPU kernels)")
    ckpt = tmp_path_factory.mktemp("ckpt")
    if request.param == "bf16":
        bf16_exact_moe_checkpoint(ckpt)
        m = load_checkpoint(ckpt, device="cuda", dtype=torch.bfloat16, progress=False).model
        m.__dict__["_test_mode"] = request.param
        yield m
        return
    from deltaserve.weights.quantizer import quantize_checkpoint

    hf = make_hf_model(True, seed=0, vocab_size=32, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                       linear_num_value_heads=8)
    ours_from_checkpoint(hf, ckpt)
    q4 = quantize_checkpoint(ckpt, tmp_path_factory.mktemp("q4"), 4, 64, progress=False)
    m = load_checkpoint(q4, device="cuda", dtype=torch.bfloat16, progress=False).model
    m.__dict__["_test_mode"] = request.param
    yield m


def _mma_moe_in_use(model) -> bool:
    """Every MoE block of the model holds its repacked experts (it went through the tensor-core MoE)."""
    from deltaserve.model import fast
    from deltaserve.model.mlp import SparseMoeBlock

    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    return bool(blocks) and all(fast.state(b).mma for b in blocks)


def _mma_gemv_in_use(model) -> bool:
    """Some linear besides the output head holds its tensor-core GEMV copy (the "mma" decode GEMV served it)."""
    from deltaserve.model import fast

    return any(fast.state(m).mma and not fast.state(m).output_head
               for m in fast.all_modules(model))


def generate(model, n: int, graphs: bool):
    """n concurrent greedy requests (lengths and max_tokens staggered: the batch shrinks through several buckets;
    every prompt is prefilled in the first step, so the second decodes all n). Returns the tokens, the engine and
    the decode batch sizes that went through the graphs."""
    cfg = EngineConfig(num_blocks=256, max_num_seqs=32, max_model_len=256, max_num_batched_tokens=1024,
                       cuda_graphs=graphs)
    engine = LLMEngine(model, None, [], cfg)
    sizes = []
    if graphs:
        run = engine.runner.graphs.run

        def recording(tokens, *args, **kwargs):
            sizes.append(len(tokens))
            return run(tokens, *args, **kwargs)

        engine.runner.graphs.run = recording
    gen = torch.Generator().manual_seed(n)
    ids = []
    for i in range(n):
        prompt = torch.randint(0, 32, (3 + 5 * i,), generator=gen).tolist()
        ids.append(engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4 + i % 5, ignore_eos=True)))
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return [done[i] for i in ids], engine, sizes


@pytest.mark.parametrize("n", [1, 3, 17])
def test_engine_graphs_equal_eager(model, n):
    eager, e_engine, _ = generate(model, n, graphs=False)
    graph, g_engine, sizes = generate(model, n, graphs=True)
    assert graph == eager
    assert e_engine.runner.graph_steps == 0
    runner = g_engine.runner
    assert runner.graphs.capturable and runner.graph_steps == len(sizes) > 0
    assert n in sizes  # every request decodes together at least once
    used = {bucket_for(b) for b in sizes}
    assert runner.graphs.batch_buckets == used
    assert all(g.graph is not None for g in runner.graphs.graphs.values())  # captured, not eager replays
    # the mode really served the model (the bf16 experts cannot take the tensor-core MoE)
    assert _mma_moe_in_use(model) == (model.__dict__["_test_mode"] == "q4-mma-moe")
    # a deployment for 32 streams decodes its q4 linears on the tensor-core GEMV (plan.decode_gemv_for_rows)
    assert g_engine.decode_gemv == e_engine.decode_gemv == "mma"
    assert _mma_gemv_in_use(model) == (model.__dict__["_test_mode"] == "q4-mma-moe")


def test_prefill_graph_equals_eager_bit_for_bit(model):
    """One sequence prefilled in three 64-token chunks (depths 0, 64, 128), each through a captured PrefillGraph on
    one cache and eagerly on another: the same last-token logits, the same KV and DeltaNet state afterwards, bit
    for bit; the graph serves every depth."""
    from deltaserve.engine.cuda_graph import PrefillGraph
    from deltaserve.model import ForwardBatch

    n, bs = 64, 16
    prompt = torch.randint(0, 32, (3 * n,), generator=torch.Generator().manual_seed(5)).tolist()
    table = list(range(3 * n // bs))
    caches = [model.make_cache(16, bs, 2, torch.bfloat16) for _ in range(2)]
    g = PrefillGraph(model, caches[0], n, max_blocks=16)
    with torch.no_grad():
        for c in range(3):
            chunk, depth = prompt[c * n:(c + 1) * n], c * n
            g.load(chunk, depth, table, 1)
            if g.graph is None:
                g.capture()
            got = g.replay().clone()
            fb = ForwardBatch.build([chunk], [depth], [table], [1], bs, device="cuda")
            want = model(fb, caches[1])
            assert g.graph is not None and torch.equal(got, want), f"chunk {c}: logits"
            for name in ("k", "v", "ssm", "conv"):
                for layer, pool in getattr(caches[0], name).items():
                    assert torch.equal(pool, getattr(caches[1], name)[layer]), f"chunk {c}: {name}[{layer}]"


def test_prefill_graph_of_several_sequences_equals_eager_bit_for_bit(model):
    """Three sequences' 48-token chunks at depths 0, 48 and 96 through one captured PrefillGraph(batch=3) on one cache
    and eagerly as one ForwardBatch on another: the same logits of every chunk's last token, the same KV and DeltaNet
    states afterwards, bit for bit; then the graph again at other depths and slots."""
    from deltaserve.engine.cuda_graph import PrefillGraph
    from deltaserve.model import ForwardBatch

    n, bs = 48, 16
    gen = torch.Generator().manual_seed(6)
    caches = [model.make_cache(48, bs, 4, torch.bfloat16) for _ in range(2)]
    tables = [list(range(i * 12, (i + 1) * 12)) for i in range(3)]
    g = PrefillGraph(model, caches[0], n, max_blocks=16, batch=3)
    with torch.no_grad():
        for depths, slots in (([0, 0, 0], [0, 1, 2]), ([48, 0, 96], [2, 3, 1])):
            chunks = [torch.randint(0, 32, (n,), generator=gen).tolist() for _ in range(3)]
            g.load_batch(chunks, depths, tables, slots)
            if g.graph is None:
                g.capture()
            got = g.replay().clone()
            want = model(ForwardBatch.build(chunks, depths, tables, slots, bs, device="cuda"), caches[1])
            assert g.graph is not None and got.shape[0] == 3 and torch.equal(got, want), f"depths {depths}: logits"
            for name in ("k", "v", "ssm", "conv"):
                for layer, pool in getattr(caches[0], name).items():
                    assert torch.equal(pool, getattr(caches[1], name)[layer]), f"depths {depths}: {name}[{layer}]"


def test_prefill_graph_replayed_after_other_lengths(model):
    """A prefill graph captured first, then graphs of six other lengths captured and replayed (fla memoises its
    varlen chunk index by argument identity for its last few calls only, so those calls evict the first graph's),
    the freed memory churned, and the first graph replayed again: the eager forward's logits and states bit for bit
    (it read freed chunk indices before the graph's batch held them: an illegal address in the server test)."""
    from deltaserve.engine.cuda_graph import PrefillGraphs
    from deltaserve.model import ForwardBatch

    bs = 16
    gen = torch.Generator().manual_seed(12)
    caches = [model.make_cache(64, bs, 4, torch.bfloat16) for _ in range(2)]
    lengths = (37, 64, 101, 5, 48, 77, 19)
    graphs = PrefillGraphs(model, caches[0], sizes=lengths, max_blocks=16)
    if not graphs.capturable:
        pytest.skip("the prefill graphs are not capturable here")
    table = list(range(16))
    with torch.no_grad():
        for n in lengths:  # each length captured once, on slot 1 at depth 0
            graphs.run([torch.randint(0, 32, (n,), generator=gen).tolist()], [0], [table], [1])
        for _ in range(4):  # the freed blocks handed out and written over
            junk = [torch.full((1 << 16,), -1, dtype=torch.int64, device="cuda") for _ in range(64)]
            del junk
            torch.cuda.empty_cache()
        chunk = torch.randint(0, 32, (37,), generator=gen).tolist()
        got = graphs.run([chunk], [0], [table], [2])
        want = model(ForwardBatch.build([chunk], [0], [table], [2], bs, device="cuda"), caches[1])
        torch.cuda.synchronize()
    assert torch.equal(got, want), "the first length's graph, replayed after the others: logits differ"
    for name in ("ssm", "conv"):
        for layer, pool in getattr(caches[0], name).items():
            assert torch.equal(pool[2], getattr(caches[1], name)[layer][2]), f"{name}[{layer}] of slot 2"


def test_engine_prefill_graphs_equal_eager(model):
    """Long prompts prefilled alone in full chunks of 64 (max_num_batched_tokens) through the captured prefill
    graph: the same greedy tokens as the eager engine."""
    def run(graphs: bool):
        cfg = EngineConfig(num_blocks=256, max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64,
                           cuda_graphs=graphs)
        engine = LLMEngine(model, None, [], cfg)
        gen = torch.Generator().manual_seed(11)
        outs = []
        for length in (200, 128, 70):
            rid = engine.add_request(torch.randint(0, 32, (length,), generator=gen).tolist(),
                                     SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
            while engine.has_unfinished():
                for out in engine.step():
                    if out.finished and out.request_id == rid:
                        outs.append(out.token_ids)
        return outs, engine

    eager, _ = run(False)
    graph, engine = run(True)
    assert graph == eager
    assert engine.runner.prefill_graph_steps >= 6 and all(g.graph is not None
                                                          for g in engine.runner.prefill_graphs.graphs.values())
    assert _mma_moe_in_use(model) == (model.__dict__["_test_mode"] == "q4-mma-moe")
