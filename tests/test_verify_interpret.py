"""Speculative verification on the model's GPU fast path, run on CPU through Triton's interpreter: a verify forward
(ForwardBatch.verify: each sequence's last token and its drafts as decode rows) gives every row the logits of a
one-token decode step at that position, bit for bit; after commit_verified(keep) the cache (DeltaNet conv windows
and states, the K/V of the kept positions) is the cache of decoding exactly the kept rows, so every later step's
logits are the same bits too (verify_helpers.check_verify_equals_decode). On CUDA: test_verify_equals_decode_steps in tests/gpu/test_model_fast_path.py and test_model_mma_path.py.
The reference path's verify: tests/test_verify.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _child(ckpt: str) -> None:
    import torch

    sys.path.insert(0, str(HERE / "gpu"))
    from kernel_cases import interpreter_numpy_shim

    interpreter_numpy_shim()
    from deltaserve.weights.loader import load_checkpoint
    from verify_helpers import check_verify_equals_decode

    check_verify_equals_decode(load_checkpoint(ckpt, dtype=torch.bfloat16, progress=False).model, torch.bfloat16)
    print("OK")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("triton", reason="the fast path's kernels need Triton (its interpreter on CPU)")
    from model_helpers import make_hf_model, ours_from_checkpoint

    path = tmp_path_factory.mktemp("verify")
    ours_from_checkpoint(make_hf_model(True, seed=1, vocab_size=32), path)
    return path


@pytest.mark.slow  # ~3 min of interpreter time
def test_verify_rows_are_decode_steps_and_commit_is_decoding_the_kept_rows(checkpoint):
    env = dict(os.environ, TRITON_INTERPRET="1", DELTASERVE_FAST_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    proc = subprocess.run([sys.executable, __file__, str(checkpoint)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


if __name__ == "__main__":
    _child(sys.argv[1])
