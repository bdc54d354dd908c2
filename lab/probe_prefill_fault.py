"""Which engine setting makes tests/gpu/test_server_gpu.py's first `generate` die in a captured prefill graph's replay
(cudaErrorInvalidAddressSpace; block size 16, the tiny bf16 MoE model, prompts of 3-150 tokens, 128 batched
tokens)? Each variant runs the test's 32 prompts alone, in a subprocess of its own (a CUDA fault ends its context),
with CUDA_LAUNCH_BLOCKING=1, and prints ok or the prompt length and step where it failed.

  PYTHONPATH=/tmp/site:$PWD python3 lab/probe_prefill_fault.py
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile

VARIANTS = [  # (name, engine overrides)
    ("as the test (block 16, 128 tokens, graphs)", {}),
    ("graphs off", {"cuda_graphs": False}),
    ("block 64", {"block_size": 64}),
    ("256 batched tokens", {"max_num_batched_tokens": 256}),
    ("block 32", {"block_size": 32}),
]
ENGINE = dict(max_num_seqs=16, max_model_len=256, max_num_batched_tokens=128, block_size=16, cuda_graphs=True)


def child(ckpt: str, overrides: dict) -> None:
    import torch

    from deltaserve.engine.llm import LLM
    from deltaserve.engine.sampling_params import SamplingParams
    from deltaserve.weights.loader import load_checkpoint

    model = load_checkpoint(ckpt, device="cuda", dtype=torch.bfloat16, progress=False).model
    llm = LLM.from_model(model, None, **{**ENGINE, **overrides})
    rng = random.Random(0)
    for i in range(32):
        prompt = [rng.randrange(32) for _ in range(rng.randrange(3, 150))]
        print(f"prompt {i}: {len(prompt)} tokens", flush=True)
        llm.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True, temperature=0))
        torch.cuda.synchronize()
    print("ok", flush=True)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], json.loads(sys.argv[3]))
        return
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from model_helpers import bf16_exact_moe_checkpoint

    ckpt = tempfile.mkdtemp()
    bf16_exact_moe_checkpoint(ckpt)
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    rows = []
    for name, overrides in VARIANTS:
        p = subprocess.run([sys.executable, __file__, "--child", ckpt, json.dumps(overrides)], env=env,
                           capture_output=True, text=True, timeout=300)
        lines = (p.stdout + p.stderr).strip().splitlines()
        print(f"## {name}\n" + "\n".join(lines[-25:]), flush=True)
        last_prompt = next((ln for ln in reversed(lines) if ln.startswith("prompt ")), "-")
        err = next((ln for ln in reversed(lines) if "Error" in ln), "")
        rows.append((name, "ok" if p.returncode == 0 and lines and lines[-1] == "ok" else
                     f"FAILED at {last_prompt}: {err[:120]}"))
    print("| variant | result |\n|---|---|")
    for name, res in rows:
        print(f"| {name} | {res} |")


if __name__ == "__main__":
    main()
