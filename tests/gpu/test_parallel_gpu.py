"""Tensor and expert parallelism on 2 GPUs over NCCL (docs/parallel.md): the engine's fast path with CUDA graphs,
against one GPU. Needs a machine with at least 2 GPUs: `pytest -m "gpu and multi_gpu" tests/gpu/test_parallel_gpu.py`
(about 3-5 minutes: each 2-rank engine starts a second process that imports torch and compiles the kernels).

- greedy tokens equal one GPU's wherever the fp32 top-1 margin exceeds twice bf16's rounding on that row;
- for a given N the decode is batch-invariant bit for bit (a sequence alone == in a batch: greedy and seeded sampling
  tokens) and prefill chunking changes logits no more than it does on one GPU;
- decode steps ran through the captured graphs (NCCL all-gathers inside them);
- a worker killed while rank 0 is idle stops rank 0's next step with an error naming it.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.model.parallel import ParallelError

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

PROMPTS = [list(range(3, 40)), list(range(50, 53)), [7] * 90, list(range(100, 229))]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, seed=11, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    from test_quant_support import write_hf_checkpoint

    return write_hf_checkpoint(tmp_path_factory.mktemp("tp") / "moe", moe=True, vocab_size=512, hidden_size=256,
                               moe_intermediate_size=128, shared_expert_intermediate_size=128)


def engine(path, n: int = 1, **kw) -> LLM:
    return LLM(path, device="cuda", dtype=kw.pop("dtype", "bfloat16"), max_model_len=512, max_num_seqs=8,
               tensor_parallel_size=n, distributed_timeout_s=120, **kw)


def tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("ep", [False, True])
def test_two_gpus_match_one(ckpt, ep):
    fp32 = engine(ckpt, dtype="float32")  # the reference path on the GPU: the margins' yardstick
    ref = [fp32.logits(p) for p in PROMPTS]
    one = engine(ckpt)
    one_logits = [one.logits(p) for p in PROMPTS]
    tp = engine(ckpt, 2, enable_expert_parallel=ep)
    try:
        for p, r, o in zip(PROMPTS, ref, one_logits):
            t = tp.logits(p)
            top2 = r.topk(2, dim=-1).values
            decided = top2[:, 0] - top2[:, 1] > 2 * (o - r).abs().amax(-1)
            assert torch.equal(t.argmax(-1)[decided], r.argmax(-1)[decided])
            assert (t - o).norm() <= 2 * (o - r).norm()  # N = 2 is as close to N = 1 as bf16 is to fp32
        batched = tokens(tp, PROMPTS, GREEDY)
        assert [tokens(tp, [p], GREEDY)[0] for p in PROMPTS] == batched  # batch invariance, bit for bit
        assert [tokens(tp, [p], SAMPLED)[0] for p in PROMPTS] == tokens(tp, PROMPTS, SAMPLED)
        assert tp.engine.runner.graph_steps > 0  # decode through the captured graphs
    finally:
        tp.shutdown()


def test_prefill_chunking_changes_no_more_than_on_one_gpu(ckpt):
    p = list(range(1, 257))
    one = [engine(ckpt, max_num_batched_tokens=m).logits(p) for m in (64, 512)]
    tps = []
    for m in (64, 512):
        tp = engine(ckpt, 2, max_num_batched_tokens=m)
        try:
            tps.append(tp.logits(p))
        finally:
            tp.shutdown()
    assert (tps[0] - tps[1]).abs().max() <= (one[0] - one[1]).abs().max()


def test_a_dead_worker_stops_rank_0(ckpt):
    tp = engine(ckpt, 2)
    try:
        tokens(tp, PROMPTS[:1], GREEDY)
        worker = tp._channel.ranks.workers[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(60)
        with pytest.raises(ParallelError, match=rf"rank 1 \(pid {worker.pid}\) exited"):
            tokens(tp, PROMPTS[:1], GREEDY)
    finally:
        tp.shutdown()
