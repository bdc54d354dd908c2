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

VARIANTS = [  # (name, engine overrides, prompt lengths: None = the test's 32 random prompts)
    ("as the test (block 16, 128 tokens, graphs)", {}, None),
    ("prefix cache off", {"enable_prefix_caching": False}, None),
    ("101 then 37 tokens (37 captured at depth 64, replayed at 0)", {}, [101, 37]),
    ("37 then 101 tokens (37 captured at depth 0, replayed at 64)", {}, [37, 101]),
    ("37 then 37 tokens", {}, [37, 37]),
]
ENGINE = dict(max_num_seqs=16, max_model_len=256, max_num_batched_tokens=128, block_size=16, cuda_graphs=True)


def child(ckpt: str, overrides: dict, lengths) -> None:
    import torch

    from deltaserve.engine.llm import LLM
    from deltaserve.engine.sampling_params import SamplingParams
    from deltaserve.weights.loader import load_checkpoint

    model = load_checkpoint(ckpt, device="cuda", dtype=torch.bfloat16, progress=False).model
    llm = LLM.from_model(model, None, **{**ENGINE, **overrides})
    rng = random.Random(0)
    for i in range(32 if lengths is None else len(lengths)):
        n = rng.randrange(3, 150) if lengths is None else lengths[i]
        prompt = [rng.randrange(32) for _ in range(n)]
        print(f"prompt {i}: {len(prompt)} tokens", flush=True)
        llm.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True, temperature=0))
        torch.cuda.synchronize()
    print("ok", flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]))
        return
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from model_helpers import bf16_exact_moe_checkpoint

    ckpt = tempfile.mkdtemp()
    bf16_exact_moe_checkpoint(ckpt)
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    rows = []
    for name, overrides, lengths in VARIANTS:
        p = subprocess.run([sys.executable, __file__, "--child", ckpt, json.dumps(overrides), json.dumps(lengths)],
                           env=env, capture_output=True, text=True, timeout=300)
        lines = (p.stdout + p.stderr).strip().splitlines()
        # the Python traceback and the error's message, without the C++ frames
        shown = [ln for ln in lines if not ln.startswith("frame #")]
        print(f"## {name}\n" + "\n".join(shown[-60:]), flush=True)
        last_prompt = next((ln for ln in reversed(lines) if ln.startswith("prompt ")), "-")
        err = next((ln for ln in reversed(lines) if "Error" in ln), "")
        rows.append((name, "ok" if p.returncode == 0 and lines and lines[-1] == "ok" else
                     f"FAILED at {last_prompt}: {err[:120]}"))
    print("| variant | result |\n|---|---|")
    for name, res in rows:
        print(f"| {name} | {res} |")


if __name__ == "__main__":
    main()
