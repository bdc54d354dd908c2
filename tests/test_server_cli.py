"""`deltaserve serve` as a user starts it: a child process on a free port, health, a completion, the served name and
the API key from the flags, a clean stop; flag errors as one line."""

from __future__ import annotations

import httpx
import pytest

from server_helpers import served, tiny_checkpoint
from deltaserve.cli import main as cli_main


def test_serve_starts_answers_and_stops(tmp_path_factory):
    ckpt = tiny_checkpoint(tmp_path_factory)
    with served(["--model", str(ckpt), "--served-model-name", "mine", "alias", "--api-key", "k", "--max-model-len",
                 "256", "--max-num-seqs", "2", "--threads", "1", "--no-enable-prefix-caching"], stop_within=30) \
            as (url, result):
        auth = {"Authorization": "Bearer k"}
        models = httpx.get(url + "/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["mine", "alias"] and models[0]["max_model_len"] == 256
        for name in ("mine", "alias"):
            r = httpx.post(url + "/v1/completions", headers=auth, timeout=60,
                           json={"model": name, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200 and r.json()["model"] == name
        assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    out = result["output"]
    assert result["returncode"] == 0, out
    assert "serving mine: max_model_len 256, max_num_seqs 2" in out and "prefix cache off" in out
    assert "Traceback" not in out


def test_serve_flag_errors_are_one_line(capsys, tmp_path):
    assert cli_main(["serve", "--preset", "tiny-moe", "--model", str(tmp_path)]) == 2
    assert "cannot be combined with --model" in capsys.readouterr().err
    assert cli_main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["serve", "--kv-cache-dtype", "int3"])


def test_preset_weights_are_built_with_the_synthetic_tokenizer():
    """--preset NAME --quant q4 (the GPU benchmark's way), here for tiny-moe on the CPU."""
    import argparse

    from deltaserve.engine.sampling_params import SamplingParams
    from deltaserve.server.args import add_serve_arguments
    from deltaserve.server.launch import load_engine

    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    args = p.parse_args(["--preset", "tiny-moe", "--quant", "q4", "--device", "cpu", "--max-model-len", "128",
                         "--max-num-seqs", "2"])
    llm, files, name = load_engine(args, None)
    assert name == "tiny-moe" and (files / "tokenizer.json").exists() and llm.tokenizer_info.chat_template
    assert any(p.dtype.is_floating_point is False for p in llm.engine.model.parameters())  # packed q4 codes
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and llm.engine.max_model_len == 128
