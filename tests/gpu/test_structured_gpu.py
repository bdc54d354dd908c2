"""Structured output on the GPU: the mask copied from pinned memory and applied on the device, through the decode
graphs and the prefill graphs; replies validate and a constrained request gets the same tokens alone, batched with
free rows, and eager.

Run on the H200: `pytest -m gpu tests/gpu/test_structured_gpu.py` (~1 min: a tiny-moe checkpoint in bf16).
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from deltaserve.engine.llm import LLM
from deltaserve.engine.sampling_params import SamplingParams
from deltaserve.structured import StructuredOutputsParams as SO
from deltaserve.synthetic.writer import make_checkpoint

pytestmark = pytest.mark.gpu
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "tags", "ok"], "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the engine's prefill needs fla's GPU kernels)")
    return make_checkpoint(tmp_path_factory.mktemp("tiny-moe"), "tiny-moe", seed=0, dtype="bf16", progress=False)


def requests():
    prompts = ["Hello", "The capital of", "x" * 40, "Numbers: 1, 2", "q", "Recipe"]
    params = []
    for i, temperature in enumerate((0.0, 0.9)):
        params += [
            SamplingParams(temperature=temperature, seed=i, max_tokens=60,
                           structured_outputs=SO(json=SCHEMA, disable_any_whitespace=True)),
            SamplingParams(temperature=temperature, seed=i + 10, max_tokens=20),
            SamplingParams(temperature=temperature, seed=i + 20, max_tokens=20, structured_outputs=SO(regex="[a-f]{12}")),
        ]
    return prompts, params


@pytest.mark.parametrize("graphs", [True, False])
def test_constrained_rows_validate_and_match_alone_and_eager(ckpt, graphs):
    prompts, params = requests()
    llm = LLM(ckpt, device="cuda", dtype="bfloat16", max_num_seqs=8, cuda_graphs=graphs)
    together = llm.generate(prompts, params)
    for out, sp in zip(together, params):
        so = sp.structured_outputs
        if so is not None and so.json:
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), SCHEMA)
        elif so is not None:
            assert out.finish_reason == "stop" and re.fullmatch("[a-f]{12}", out.text)
    alone = [llm.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params)]
    assert [o.token_ids for o in together] == alone
    if graphs:
        assert llm.engine.runner.graph_steps > 0
        eager = LLM(ckpt, device="cuda", dtype="bfloat16", max_num_seqs=8, cuda_graphs=False)
        assert [o.token_ids for o in eager.generate(prompts, params)] == alone
