"""Tensor- and expert-parallel engines over gloo: real processes on this machine (rank 0 in the test process, the
other ranks started by LLM itself, or every rank by torchrun).

- an N-rank engine's logits are the same bits as N ranks in one process (tests/parallel_helpers.py), chunked
  prefill included, so the process path adds nothing to the arithmetic that test_parallel_model.py checks;
- its greedy tokens equal one device's, batched or alone, through decode and prefill graphs (their eager replay on
  CPU) and across a prefix-cache hit; seeded sampling repeats;
- a rank that dies ends every other rank with an error naming it, within seconds, never a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.model.parallel import ParallelError
from deltaserve.synthetic import get_preset, make_checkpoint
from deltaserve.synthetic.quantized import write_quantized_synthetic
from parallel_helpers import load_ranks, run_ranks
from test_parallel_model import forward

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60  # seconds a collective may wait before every rank gives up
GREEDY = SamplingParams(temperature=0, max_tokens=6)
PROMPTS = [list(range(3, 20)), list(range(50, 53)), list(range(100, 140))]
LONG = [(7 * i) % 1000 + 3 for i in range(150)]  # 150 tokens: prefill chunks of 64, 64, 22 under a 64-token budget


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gloo")
    wide = get_preset("tiny-moe")  # expert widths 64: a 2-way split keeps whole groups of 32 (MLX q4)
    wide.config["text_config"].update(moe_intermediate_size=64, shared_expert_intermediate_size=64)
    return {
        "moe": make_checkpoint(root / "moe", "tiny-moe", dtype="fp32", progress=False),
        "dense": make_checkpoint(root / "dense", "tiny-dense", dtype="fp32", progress=False),
        "q4": write_quantized_synthetic(root / "q4", wide, "q4", group_size=32, progress=False),
    }


def engine(path, n: int = 1, **kw) -> LLM:
    return LLM(path, dtype="float32", max_model_len=256, tensor_parallel_size=n, distributed_timeout_s=TIMEOUT, **kw)


def tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def thread_logits(path, n: int, ids: list[int], chunk: int | None = None, ep: bool = False) -> torch.Tensor:
    ranks = load_ranks(path, n, torch.float32, ep)
    return run_ranks(n, lambda r: forward(ranks[r], [ids], chunk))[0][0]


def shut(llm: LLM) -> None:
    workers = list(llm._channel.ranks.workers)
    llm.shutdown()
    assert [w.wait(TIMEOUT) for w in workers] == [0] * len(workers)  # every rank left its loop cleanly


def prefix_hit(llm: LLM) -> tuple[list[list[int]], int]:
    """A prompt, then one sharing its first 140 tokens: the second resumes from the first's KV blocks and DeltaNet
    snapshot at token 128 (engine.cache.load_state / save_state). (tokens of both, cached tokens of the second)"""
    longer = SamplingParams(temperature=0, max_tokens=24)  # a wrong resumed state shows within a few tokens
    first = llm.generate([LONG + [5, 6]], GREEDY)[0]
    second = llm.generate([LONG[:140] + [9, 9, 9]], longer)[0]
    return [first.token_ids, second.token_ids], second.metrics.num_cached_tokens


def test_two_ranks_moe(ckpts):
    path = ckpts["moe"]
    one = engine(path)
    want, want_hit = tokens(one, PROMPTS), prefix_hit(one)
    tp = engine(path, 2, max_num_batched_tokens=64)  # LONG is prefilled in chunks of 64 (the engine's alignment)
    try:
        assert torch.equal(tp.logits(LONG), thread_logits(path, 2, LONG, chunk=64))
        assert tokens(tp, PROMPTS) == want  # greedy tokens as on one device, batched
        assert [tokens(tp, [p])[0] for p in PROMPTS] == want  # and alone
        sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=4)
        assert tokens(tp, PROMPTS, sampled) == tokens(tp, PROMPTS, sampled)  # sampling is seeded on rank 0
        hit = prefix_hit(tp)  # the prefix cache's state copies reach every rank
        assert hit == want_hit and hit[1] == 128
    finally:
        shut(tp)


def test_four_ranks_expert_parallel(ckpts):
    path = ckpts["moe"]
    want = tokens(engine(path), PROMPTS)
    tp = engine(path, 4, enable_expert_parallel=True, max_num_batched_tokens=64)
    try:
        assert torch.equal(tp.logits(LONG), thread_logits(path, 4, LONG, chunk=64, ep=True))
        assert tokens(tp, PROMPTS) == want
    finally:
        shut(tp)


@pytest.mark.parametrize("name", ["dense", "q4"])
def test_two_ranks_dense_and_mlx_q4(ckpts, name):
    path = ckpts[name]
    want = tokens(engine(path), PROMPTS)
    tp = engine(path, 2, max_num_batched_tokens=64)
    try:
        assert torch.equal(tp.logits(LONG), thread_logits(path, 2, LONG, chunk=64))
        assert tokens(tp, PROMPTS) == want
    finally:
        shut(tp)


def test_graph_steps_reach_every_rank(ckpts):
    """The runner's decode-graph and prefill-graph entry points (CUDA graphs on GPUs; here their eager replay, as
    the runner's tests run them on CPU) are sent to the other ranks like an eager step: the same tokens."""
    path = ckpts["moe"]
    want = tokens(engine(path, max_num_batched_tokens=16), PROMPTS)
    tp = engine(path, 2, cuda_graphs=True, max_num_batched_tokens=16)
    tp.engine.runner.graphs_off_device = True  # rank 0's runner decides; the other ranks follow its messages
    graphs, pending = tp.engine.runner.graphs, []
    run = graphs.run

    def spy(*args, **kwargs):  # rows whose input token rank 0 sampled but has not read back: token_source is sent
        pending.append(any(kwargs.get("from_device") or ()))
        return run(*args, **kwargs)

    graphs.run = spy
    try:
        assert tokens(tp, PROMPTS) == want
        assert any(pending)
        runner = tp.engine.runner
        assert runner.graph_steps > 0 and runner.prefill_graph_steps > 0
    finally:
        shut(tp)


def test_a_size_the_model_cannot_split_fails_before_any_process_starts(ckpts):
    with pytest.raises(ValueError, match="linear_num_value_heads = 2 is not a multiple of 4"):
        engine(ckpts["dense"], 4)


# ---- a rank that dies -------------------------------------------------------------------------------------------


def test_a_dead_worker_stops_rank_0_with_its_name(ckpts):
    tp = engine(ckpts["moe"], 2)
    worker = tp._channel.ranks.workers[0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(TIMEOUT)
    start = time.monotonic()
    with pytest.raises(ParallelError, match=rf"rank 1 \(pid {worker.pid}\) exited with status -9"):
        tokens(tp, PROMPTS)
    assert time.monotonic() - start < 10
    with pytest.raises(ParallelError, match="stopped by an earlier failure"):  # the engine stays stopped
        tokens(tp, PROMPTS)


def test_a_worker_dying_mid_generation_stops_rank_0(ckpts):
    tp = engine(ckpts["moe"], 2)
    worker = tp._channel.ranks.workers[0]
    tokens(tp, PROMPTS[:1])  # warm: steps run
    killer = threading.Timer(0.5, os.kill, (worker.pid, signal.SIGKILL))
    start = time.monotonic()
    killer.start()
    with pytest.raises(ParallelError, match=r"rank 1 \(pid \d+\) exited with status -9"):
        tokens(tp, PROMPTS, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    killer.join()
    assert time.monotonic() - start < 30


DRIVER = """
import sys, time
from deltaserve.engine.llm import LLM
llm = LLM(sys.argv[1], dtype="float32", max_model_len=256, tensor_parallel_size=2, distributed_timeout_s=60)
print(llm._channel.ranks.workers[0].pid, flush=True)
time.sleep(600)
"""


def test_a_dead_rank_0_stops_its_workers(ckpts, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    driver = subprocess.Popen([sys.executable, str(script), str(ckpts["moe"])], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        worker = int(driver.stdout.readline())
        driver.kill()
        driver.wait(TIMEOUT)
        start = time.monotonic()
        while _alive(worker) and time.monotonic() - start < 20:
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived rank 0 by 20 s"
        err = driver.stderr.read()  # the worker inherited it: complete once the worker is gone
        assert "tensor-parallel rank 1" in err and "rank 0" in err, err
    finally:
        driver.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its new parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


# ---- torchrun ----------------------------------------------------------------------------------------------------


def test_torchrun_starts_every_rank(ckpts):
    """`torchrun -m deltaserve run --distributed-executor-backend external_launcher`: rank 0 prints the reply, the
    other rank serves its steps and exits 0; the reply is the one-device reply."""
    args = ["--model", str(ckpts["moe"]), "--prompt", "hello", "--max-tokens", "6", "--temperature", "0", "--no-chat",
            "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    one = subprocess.run([sys.executable, "-m", "deltaserve", "run", *args], capture_output=True, text=True,
                         timeout=120, env=env)
    assert one.returncode == 0, one.stderr
    tp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "deltaserve", "run", *args, "--tensor-parallel-size", "2",
                         "--distributed-executor-backend", "external_launcher"],
                        capture_output=True, text=True, timeout=180, env=env)
    assert tp.returncode == 0, tp.stderr
    assert tp.stdout == one.stdout  # the reply (rank 0 alone writes stdout)


def test_serve_with_two_ranks(ckpts):
    """`deltaserve serve --tensor-parallel-size 2`: the completion one device gives, then a clean stop of both ranks."""
    import httpx
    from server_helpers import served

    want = engine(ckpts["moe"]).generate(["Hello"], GREEDY)[0].text
    with served(["--model", str(ckpts["moe"]), "--dtype", "float32", "--max-model-len", "256", "--threads", "1",
                 "--tensor-parallel-size", "2"]) as (url, result):
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"prompt": "Hello", "max_tokens": GREEDY.max_tokens, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
    assert result["returncode"] == 0, result["output"]
    assert "Traceback" not in result["output"]
