"""The `deltaserve` command: run on the built-in default (subprocess, temp cache dir), checkpoints, info,
quantize, bench, and one-line errors with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from deltaserve.cli import main


def deltaserve(args: list[str], cache, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, DELTASERVE_CACHE=str(cache), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "deltaserve", *args], input=stdin if stdin is not None else "",
                          capture_output=True, text=True, env=env, timeout=300)


def test_run_creates_the_default_once_then_reuses_it(tmp_path):
    first = deltaserve(["run", "--prompt", "Hello", "--max-tokens", "12", "--temperature", "0"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert "created the built-in tiny-moe synthetic checkpoint" in first.stderr
    index = tmp_path / "tiny-moe-seed0" / "model.safetensors.index.json"
    assert index.exists()
    stamp = index.stat().st_mtime_ns
    assert "prefill: " in first.stderr and "decode: 11 tokens" in first.stderr and "tok/s" in first.stderr
    assert first.stdout.strip()  # random weights: some text, whatever it says
    again = deltaserve(["run", "--prompt", "Hello", "--max-tokens", "12", "--temperature", "0"], tmp_path)
    assert again.returncode == 0 and "using the built-in tiny-moe" in again.stderr
    assert index.stat().st_mtime_ns == stamp
    assert again.stdout == first.stdout  # greedy: same text


def test_interactive_chat_reads_turns_from_stdin(tmp_path):
    out = deltaserve(["run", "--max-tokens", "4", "--seed", "1"], tmp_path, stdin="hi there\n/reset\nhello\n/exit\n")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("prefill: ") == 2 and "Traceback" not in out.stderr


def test_make_checkpoint_config_only_and_info(tmp_path, capsys):
    out = tmp_path / "cfg"
    assert main(["make-checkpoint", str(out), "--preset", "qwen3.6-35b-a3b", "--config-only"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "config.json" in names and "tokenizer.json" in names and "tokenizer_config.json" in names
    assert not any(n.endswith(".safetensors") for n in names)
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "qwen3_5_moe" in text and "40 layers" in text


def test_quantize_then_run_the_quantized_checkpoint(tmp_path, capsys):
    src, dst = tmp_path / "dense", tmp_path / "q8"
    assert main(["make-checkpoint", str(src), "--preset", "tiny-dense", "--dtype", "fp32"]) == 0
    assert main(["quantize", str(src), str(dst), "--bits", "8"]) == 0
    assert main(["info", str(dst)]) == 0
    assert main(["run", "--model", str(dst), "--prompt", "hi", "--max-tokens", "3", "--temperature", "0"]) == 0
    assert "decode: 2 tokens" in capsys.readouterr().err
    assert main(["run", "--model", str(dst), "--prompt", "hi", "--max-tokens", "3", "--temperature", "0",
                 "--kv-cache-dtype", "fp8"]) == 0  # the fp8 K/V cache (tiny-dense has full-attention layers)
    assert "decode: 2 tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--model", "{tmp}/missing", "--prompt", "x"], "not a directory"),
        (["run", "--model", "{tmp}/badcfg", "--prompt", "x"], "unknown model_type 'llama'"),
        (["info", "{tmp}/badcfg"], "unknown model_type 'llama'"),
        (["info", "{tmp}/missing"], "not a directory"),
        (["make-checkpoint", "{tmp}/x", "--preset", "nope"], "--preset 'nope' is not known"),
        (["make-checkpoint", "{tmp}/x", "--preset", "tiny-moe", "--quant", "q4", "--config-only"], "cannot be combined"),
        (["quantize", "{tmp}/missing", "{tmp}/out", "--bits", "4"], "not a directory"),
        (["run", "--threads", "0", "--prompt", "x"], "--threads must be positive"),
        (["run", "--model", "{tmp}/badcfg", "--prompt", "x", "--top-p", "3"], "unknown model_type"),
    ],
)
def test_errors_are_one_line_with_status_2(tmp_path, capsys, argv, message):
    (tmp_path / "badcfg").mkdir()
    (tmp_path / "badcfg" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "badcfg" / "tokenizer.json").write_text("{}")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("deltaserve: error: ") and message in err and "\n" not in err


def test_bad_sampling_value_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "m"
    main(["make-checkpoint", str(src), "--preset", "tiny-moe"])
    capsys.readouterr()
    assert main(["run", "--model", str(src), "--prompt", "x", "--top-p", "3"]) == 2
    assert "SamplingParams.top_p must be in (0.0, 1.0], found 3.0" in capsys.readouterr().err


@pytest.mark.parametrize("command", [[], ["run"], ["make-checkpoint"], ["info"], ["quantize"]])
def test_help_everywhere(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command, "--help"])
    assert e.value.code == 0 and "usage: deltaserve" in capsys.readouterr().out


def test_bench_hands_its_arguments_to_the_gpu_module(monkeypatch):
    seen = []
    fake = types.ModuleType("deltaserve.bench.main")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "deltaserve.bench.main", fake)
    assert main(["bench", "--model", "x", "-n", "3"]) == 0
    assert seen == [["--model", "x", "-n", "3"]]


def test_bench_without_the_gpu_module_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "deltaserve.bench.main", None)  # import raises ModuleNotFoundError
    assert main(["bench", "--anything"]) == 2
    assert "needs the GPU benchmark module" in capsys.readouterr().err


def test_speed_line_reports_drafting():
    """`run`'s closing line: prefill and decode speeds, and with speculative decoding the drafts accepted."""
    from deltaserve.cli import speed_line
    from deltaserve.engine.request import RequestMetrics

    m = RequestMetrics(arrival=0.0)
    m.first_scheduled, m.first_token, m.finished = 0.0, 0.5, 2.5
    out = types.SimpleNamespace(metrics=m, prompt_token_ids=[1] * 10, token_ids=[1] * 9, finish_reason="length")
    assert "drafts" not in speed_line(out) and "decode: 8 tokens" in speed_line(out)
    m.num_drafted, m.num_accepted, m.num_spec_steps = 12, 6, 4
    assert "drafts: 6/12 accepted, 2.50 tokens a drafting step" in speed_line(out)
