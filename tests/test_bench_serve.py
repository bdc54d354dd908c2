"""`deltaserve bench-serve` against a tiny server on 127.0.0.1: every request completes with exactly --output-len
tokens, the latencies are measured, and one record in the bench format is appended."""

from __future__ import annotations

import json

import pytest

from server_helpers import Served, tiny_checkpoint
from deltaserve.bench import serve as bench_serve
from deltaserve.cli import main as cli_main


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tiny_checkpoint(tmp_path_factory), max_model_len=128, max_num_seqs=4)
    yield s
    s.stop()


def run(served, tmp_path, capsys, *extra) -> dict:
    argv = ["bench-serve", "--base-url", served.url, "--num-prompts", "6", "--input-len", "12", "--output-len", "5",
            "--results", str(tmp_path), "--gpu", "test-gpu", "--model-label", "tiny-moe", *extra]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    printed = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return printed


def test_fixed_concurrency_record(served, tmp_path, capsys):
    rec = run(served, tmp_path, capsys, "--max-concurrency", "3")
    assert (rec["engine"], rec["test"], rec["n"], rec["depth"], rec["batch"]) == ("deltaserve", "serve", 5, 12, 3)
    assert rec["completed"] == 6 and rec["failed"] == 0 and rec["output_tokens"] == 30
    assert rec["model"] == "tiny-moe" and rec["gpu"] == "test-gpu" and rec["tok_s"] == rec["output_tok_s"] > 0
    assert 0 < rec["ttft_ms_p50"] <= rec["ttft_ms_p99"] and 0 < rec["itl_ms_p50"] <= rec["itl_ms_p99"]
    assert rec["total_tok_s"] > rec["output_tok_s"] and rec["request_throughput"] > 0
    [line] = (tmp_path / "test-gpu-" f"{rec['date']}.jsonl").read_text().splitlines()
    assert json.loads(line) == rec
    assert served.idle_and_free()


def test_poisson_arrivals_and_a_time_box(served, tmp_path, capsys):
    rec = run(served, tmp_path, capsys, "--max-concurrency", "2", "--request-rate", "40", "--no-record")
    assert rec["completed"] == 6 and rec["request_rate"] == 40 and "Poisson 40.0/s" in rec["notes"]
    assert not list(tmp_path.iterdir())
    args = bench_serve.parse_args(["--base-url", served.url, "--num-prompts", "50", "--input-len", "4",
                                   "--output-len", "40", "--max-duration", "0.2", "--warmup", "0",
                                   "--max-concurrency", "2"])
    results, _ = bench_serve.asyncio.run(bench_serve.run(args, bench_serve.make_prompts(50, 4, "0,1000", 0), "tiny"))
    assert 1 <= len(results) < 50 and all(r.ok and r.output_tokens == 40 for r in results)


def test_percentiles():
    assert bench_serve.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert bench_serve.percentile([5.0], 99) == 5.0
