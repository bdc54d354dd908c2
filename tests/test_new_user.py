"""What a new user trips over, tried as one would: each gets a one-line error naming the problem, or the behaviour
vLLM's users expect. (In-process `deltaserve` calls on a tiny-moe checkpoint made once for the module.)"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deltaserve.cli import CLIError, main, prompt_from_args, repl
from deltaserve.engine.prompts import prompt_parts

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "tiny-moe"
    assert main(["make-checkpoint", str(out), "--preset", "tiny-moe"]) == 0
    return out


@pytest.fixture(scope="module")
def llm(ckpt):
    from deltaserve import LLM

    torch.set_num_threads(1)
    return LLM(ckpt, max_model_len=96, max_num_seqs=4)


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"prompt": None, "prompt_file": None, **kw})


def test_a_prompt_that_is_not_utf8_is_named(ckpt, tmp_path, capsys):
    bad = os.fsdecode(b"caf\xe9 au lait")  # what argv holds for latin-1 bytes
    assert main(["run", "--model", str(ckpt), "--prompt", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("deltaserve: error: --prompt is not valid UTF-8 (byte 0xe9 at offset 3); convert it first, e.g. "
                   "iconv -t UTF-8")
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"ok\n\xff")
    assert main(["run", "--model", str(ckpt), "--prompt-file", str(path)]) == 2
    assert f"--prompt-file {path} is not valid UTF-8 (byte 0xff at offset 3)" in capsys.readouterr().err


def test_a_long_prompt_from_a_file_or_stdin(tmp_path, monkeypatch):
    text = "line one\nline two: é\n" * 200
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8")
    assert prompt_from_args(_args(prompt_file=str(path))) == text
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert prompt_from_args(_args(prompt="-")) == text
    assert prompt_from_args(_args(prompt="plain")) == "plain" and prompt_from_args(_args()) is None
    with pytest.raises(CLIError, match="give --prompt or --prompt-file, not both"):
        prompt_from_args(_args(prompt="a", prompt_file=str(path)))
    with pytest.raises(CLIError, match="--prompt-file .*missing.txt: No such file"):
        prompt_from_args(_args(prompt_file=str(tmp_path / "missing.txt")))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without a usable CUDA device")
def test_device_cuda_without_cuda_is_one_line(capsys):
    from deltaserve import LLM

    assert main(["run", "--device", "cuda", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deltaserve: error: device 'cuda': this torch ") and "use device='cpu'" in err
    assert "Traceback" not in err and err.count("\n") == 1
    with pytest.raises(ValueError, match="device 'cuda:1': this torch"):
        LLM("/nonexistent", device="cuda:1")


def test_prompt_forms_and_bytes():
    assert prompt_parts("hi") == ("hi", None) and prompt_parts([3, 4]) == (None, [3, 4])
    assert prompt_parts(torch.tensor([7, 8])) == (None, [7, 8])
    with pytest.raises(TypeError, match=r"prompt 2 is bytes; decode it to a str first \(e.g. prompt.decode"):
        prompt_parts(b"hi", 2)
    with pytest.raises(TypeError, match="element 1 is -3"):
        prompt_parts([1, -3])
    with pytest.raises(TypeError, match="found float"):
        prompt_parts(1.5)


def test_vllm_prompt_dicts_and_bytes_in_the_api(llm):
    from deltaserve import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=4)
    ids = llm.encode("The sea")
    want = llm.generate(ids, sp)[0]
    assert llm.generate({"prompt_token_ids": ids}, sp)[0].token_ids == want.token_ids
    by_text = llm.generate([{"prompt": "The sea"}, "The sea"], sp)
    assert by_text[0].token_ids == by_text[1].token_ids == want.token_ids and by_text[0].prompt == "The sea"
    with pytest.raises(TypeError, match="prompt 1 is bytes"):
        llm.generate(["ok", b"The sea"], sp)
    assert not llm.engine.has_unfinished()  # refused before any request was added


def test_default_sampling_follows_generation_config_like_vllm(ckpt, llm, monkeypatch):
    from deltaserve import LLM, SamplingParams

    gen = json.loads((ckpt / "generation_config.json").read_text())
    want = {k: gen[k] for k in ("temperature", "top_p", "top_k") if k in gen}
    assert want, "the tiny checkpoint's generation_config sets sampling defaults"
    got = llm.get_default_sampling_params()
    assert {k: getattr(got, k) for k in want} == want
    seen = []
    real = llm.engine.add_request
    monkeypatch.setattr(llm.engine, "add_request", lambda ids, sp, **kw: seen.append(sp) or real(ids, sp, **kw))
    llm.generate("hi")  # no SamplingParams: the checkpoint's defaults, as vLLM's generation_config="auto"
    assert {k: getattr(seen[-1], k) for k in want} == want
    llm.generate("hi", SamplingParams(max_tokens=2))  # explicit: as given
    assert seen[-1].temperature == 1.0 and seen[-1].top_p == 1.0
    plain = LLM(ckpt, max_model_len=32, max_num_seqs=1, generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ValueError, match="generation_config must be 'auto' or 'vllm', found 'hf'"):
        LLM(ckpt, generation_config="hf")


def _chat(llm, lines: list[str], monkeypatch, capsys, chat: bool = True) -> str:
    from deltaserve import SamplingParams

    feed = iter(lines)

    def fake_input(prompt=""):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    assert repl(llm, SamplingParams(temperature=0, max_tokens=3), chat, True) == 0
    return capsys.readouterr().err


def test_chat_reset_says_so_and_a_long_chat_keeps_going(llm, monkeypatch, capsys):
    err = _chat(llm, ["hello", "/reset", "hi"], monkeypatch, capsys)
    assert "(conversation cleared)" in err and err.count("prefill: ") == 2
    # max_model_len 96: each turn adds ~20 tokens of template and text; the conversation outgrows it, the oldest
    # turns are dropped and said to be, and the chat goes on to the last line
    turns = [f"turn {i} says something a little long" for i in range(8)]
    err = _chat(llm, turns, monkeypatch, capsys)
    assert "outgrew max_model_len 96: dropped its oldest" in err and err.count("prefill: ") == len(turns)
    assert "Traceback" not in err
    err = _chat(llm, ["word " * 200, "hi"], monkeypatch, capsys)  # one message too long alone: said, then go on
    assert "that message alone is" in err and "more than max_model_len 96" in err and err.count("prefill: ") == 1
    err = _chat(llm, [os.fsdecode(b"\xff\xfe"), "/exit"], monkeypatch, capsys, chat=False)
    assert "that line is not valid UTF-8 (byte 0xff at offset 0)" in err


def test_bench_help_names_only_files_in_the_repository(capsys):
    import re

    from deltaserve.bench import main as bench

    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = capsys.readouterr().out + (bench.__doc__ or "")
    assert "bench/README.md" in text
    for path in set(re.findall(r"\b[\w./-]+\.md\b", text)):
        assert (ROOT / path).exists(), f"bench points to {path}, which is not in the repository"


def test_the_summary_says_the_gpu_tests_were_left_out():
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/gpu/test_engine_graph_gpu.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert "gpu tests deselected: run `python -m pytest -m gpu tests/gpu` on a GPU machine" in out.stdout, out.stdout


def test_n_samples_per_prompt(llm):
    from deltaserve import SamplingParams

    sp = SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    one = llm.generate("The sea", sp)[0]
    many = llm.generate(["The sea", "Hi"], sp.clone(n=3))
    assert len(many) == 2 and [len(o.outputs) for o in many] == [3, 3]
    first = many[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert first.outputs[0].token_ids == one.token_ids == first.token_ids  # sample 0 keeps the seed
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1, "n samples with derived seeds should differ"
    again = llm.generate("The sea", sp.clone(n=3))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in first.outputs]  # reproducible
    assert llm.generate("The sea", sp)[0].outputs[0].token_ids == one.token_ids  # n=1: outputs[0] is itself
    with pytest.raises(ValueError, match=r"SamplingParams.n must be in \[1, inf\], found 0"):
        SamplingParams(n=0)


def test_logprobs_of_the_sampled_and_top_tokens(llm):
    from deltaserve import SamplingParams

    prompt = llm.encode("The sea is")
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3))[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 4
    logits = llm.logits(prompt + out.token_ids[:-1])[-4:]  # the raw next-token logits of each output position
    want = torch.log_softmax(logits.double(), dim=-1)
    for step, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry[token].rank == 1  # greedy: the most likely token
        top = want[step].topk(3)
        assert set(entry) == set(top.indices.tolist())
        for t, lp in entry.items():
            assert abs(lp.logprob - want[step, t].item()) < 1e-4  # fp32 log_softmax against fp64
    completion = out.outputs[0]
    assert completion.logprobs == out.logprobs
    assert abs(completion.cumulative_logprob - sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs))) < 1e-9
    sampled = llm.generate(prompt, SamplingParams(temperature=1.5, seed=3, max_tokens=3, logprobs=0))[0]
    assert all(list(e) == [t] for t, e in zip(sampled.token_ids, sampled.logprobs))  # the sampled token alone
    assert llm.generate(prompt, SamplingParams(max_tokens=2))[0].logprobs is None
    with pytest.raises(ValueError, match=r"SamplingParams.logprobs must be in \[0, 20\], found 21"):
        SamplingParams(logprobs=21)
