"""The engine's sampling stage (engine/sampler.py) and the plain-sampling kernel (kernels/triton_sampling.py).

- Sampler == kernels/sampling.sample, row for row, over several steps of requests with every kind of parameter
  (the penalties' statistics kept on the device per state slot instead of rebuilt from the token lists);
- a slot handed to a new request starts its statistics afresh;
- sample_plain (Triton interpreter) == the reference for greedy and temperature rows, ties and -inf included.
tests/gpu/test_sampling_gpu.py checks the kernel bit for bit on CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from deltaserve.engine.request import Request
from deltaserve.engine.sampler import Sampler
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.kernels.sampling import SamplingTensors, sample, seed_to_int64, token_statistics

V = 300


def _request(i: int, slot: int, params: SamplingParams, prompt_len: int = 5) -> Request:
    g = torch.Generator().manual_seed(i)
    r = Request(str(i), torch.randint(0, V, (prompt_len,), generator=g).tolist(), params, seed=1000 + i)
    r.state_slot = slot
    return r


def _reference(logits, reqs, positions):
    seen, counts = token_statistics([r.prompt_token_ids for r in reqs], [r.output_token_ids for r in reqs], V)
    ps = [r.params for r in reqs]
    f = lambda vals, dt=torch.float32: torch.tensor(vals, dtype=dt)  # noqa: E731
    t = SamplingTensors(f([p.temperature for p in ps]), f([p.top_k for p in ps], torch.int64), f([p.top_p for p in ps]),
                        f([p.min_p for p in ps]), f([p.repetition_penalty for p in ps]),
                        f([p.presence_penalty for p in ps]), f([p.frequency_penalty for p in ps]),
                        f([seed_to_int64(r.seed) for r in reqs], torch.int64), f(positions, torch.int64), seen, counts)
    return sample(logits, t)


def test_sampler_equals_reference_over_steps():
    kinds = [SamplingParams(temperature=0), SamplingParams(temperature=0.8),
             SamplingParams(temperature=1.0, top_k=7), SamplingParams(temperature=0.7, top_p=0.8, min_p=0.05),
             SamplingParams(temperature=0, repetition_penalty=1.3),
             SamplingParams(temperature=1.1, presence_penalty=0.5, frequency_penalty=0.7)]
    reqs = [_request(i, slot=5 - i, params=p) for i, p in enumerate(kinds)]
    sampler = Sampler(V, num_slots=8, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for step in range(12):
        logits = torch.randn(len(reqs), V, generator=g) * 3
        logits[:, :20] = 6.0  # a band of equal logits: ties and repeated tokens for the penalties
        positions = [r.num_tokens for r in reqs]
        want = _reference(logits, reqs, positions)
        got = sampler.sample(logits, reqs, positions)
        assert torch.equal(got, want), step
        for r, t in zip(reqs, got.tolist()):
            r.output_token_ids.append(t)
    assert sampler.penalties is not None and sampler.penalties.counts.sum() > 0


def test_a_slot_given_to_a_new_request_starts_afresh():
    sampler = Sampler(V, num_slots=2, device=torch.device("cpu"))
    p = SamplingParams(temperature=0, frequency_penalty=2.0)
    first = _request(1, 0, p)
    logits = torch.zeros(1, V)
    logits[0, 3] = 1.0
    for _ in range(3):  # token 3 three times: its count grows in slot 0
        first.output_token_ids.append(int(sampler.sample(logits, [first], [first.num_tokens])[0]))
    second = _request(2, 0, p)  # the same slot, a new request: no counts of the first's tokens
    assert int(sampler.sample(logits, [second], [second.num_tokens])[0]) == 3


def _interpreter_child() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.kernels import sampling as S
    from deltaserve.kernels.triton_sampling import sample_plain

    g = torch.Generator().manual_seed(0)
    for b, v in ((1, 7), (5, 5000), (3, 4100)):
        logits = torch.randn(b, v, generator=g) * 3
        logits[0, v // 2] = logits[0, v // 3] = 40.0  # a tie on a greedy row: the lower id
        logits[-1, : v // 2] = float("-inf")  # a masked half
        temp = torch.tensor([0.0, 0.7, 1.3, 0.0, 1.0][:b])
        seeds = torch.randint(-(1 << 62), 1 << 62, (b,), generator=g)
        pos = torch.randint(0, 1 << 20, (b,), generator=g)
        t = S.SamplingTensors(temp, torch.zeros(b, dtype=torch.int64), torch.ones(b), torch.zeros(b), torch.ones(b),
                              torch.zeros(b), torch.zeros(b), seeds, pos)
        want = S.sample(logits, t)
        out = torch.full((b,), -1, dtype=torch.int64)  # poisoned
        got = sample_plain(logits, temp, S.row_keys(seeds, pos), out=out)
        assert got is out and torch.equal(got, want), (b, v, got, want)
    print("SAMPLE-PLAIN-OK")


def test_sample_plain_interpreted():
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_REFERENCE="0")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "SAMPLE-PLAIN-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _interpreter_child()
