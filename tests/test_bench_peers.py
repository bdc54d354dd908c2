"""Peer benchmark tooling (deltaserve.bench.peers): llama-bench output -> our records, the transformers peer on the
tiny preset (CPU), and the side-by-side table."""

from __future__ import annotations

import json

import pytest

from deltaserve.bench import peers

# Two tests as `llama-bench -o json` prints them (fields of tools/llama-bench/llama-bench.cpp; numbers shaped like
# the H200 run in shared/GPU_NOTES.md).
BASE = {
    "build_commit": "0123abc", "build_number": 7000, "cpu_info": "AMD EPYC", "gpu_info": "NVIDIA H200",
    "backends": "CUDA", "model_filename": "/tmp/q36-35b-q4_k_m.gguf", "model_type": "qwen35moe 35B.A3B Q4_K - Medium",
    "model_size": 19704000000, "model_n_params": 34660610688, "n_batch": 2048, "n_ubatch": 512, "n_threads": 16,
    "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99,
    "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False, "flash_attn": 1, "devices": "auto",
    "tensor_split": "0.00", "tensor_buft_overrides": "none", "embeddings": False, "no_op_offload": 0,
    "test_time": "2026-11-29T10:00:00Z",
}  # fmt: skip
PP = dict(BASE, n_prompt=512, n_gen=0, n_depth=0, avg_ns=55670000, stddev_ns=9000000, avg_ts=9197.0,
          stddev_ts=1816.0, samples_ns=[1, 2, 3], samples_ts=[7000.0, 9500.0, 11091.0])  # fmt: skip
TG = dict(BASE, n_prompt=0, n_gen=128, n_depth=4096, avg_ns=515000000, stddev_ns=5000000, avg_ts=249.3,
          stddev_ts=2.4, samples_ns=[1, 2, 3], samples_ts=[247.0, 250.0, 251.0])  # fmt: skip


def test_llama_bench_json_and_jsonl_become_our_records():
    as_json = json.dumps([PP, TG], indent=2)
    as_jsonl = json.dumps(PP) + "\n" + json.dumps(TG) + "\n"
    for text in (as_json, as_jsonl):
        recs = peers.llama_bench_records(peers.read_llama_bench(text), model="qwen3.6-35b-a3b", commit="abc1234")
        pp, tg = recs
        assert pp["engine"] == "llama.cpp" and pp["gpu"] == "NVIDIA H200" and pp["quant"] == "q4_k_m"
        assert (pp["test"], pp["n"], pp["depth"], pp["batch"]) == ("pp", 512, 0, 1)
        assert pp["tok_s"] == 9500.0 and pp["tok_s_std"] == 1816.0 and pp["reps"] == 3  # median of the samples
        assert pp["date"] == "2026-11-29" and pp["commit"] == "abc1234" and "mean 9197.00" in pp["notes"]
        assert pp["gbps"] is None
        assert (tg["test"], tg["n"], tg["depth"], tg["tok_s"]) == ("tg", 128, 4096, 250.0)
        assert tg["gbps"] > 0 and 0 < tg["roofline_pct"] < 100  # a known preset: the roofline is computed
        assert "fa 1" in tg["notes"] and "0123abc" in tg["notes"]


def test_roofline_ceiling_is_the_measured_copy_bandwidth_of_that_gpu():
    from deltaserve.bench import roofline

    assert roofline.copy_ceiling("NVIDIA H200") == 4.29e12
    assert roofline.copy_ceiling("NVIDIA H100 80GB HBM3") == 3.00e12
    assert roofline.copy_ceiling("NVIDIA H100 PCIe") is None  # another H100: its bandwidth was never measured
    assert roofline.copy_ceiling("NVIDIA A100-SXM4-80GB") is None and roofline.copy_ceiling("cpu") is None
    assert roofline.roofline(1e-3, 2e9, None) == (2000.0, None)
    (h200,) = peers.llama_bench_records([TG], model="qwen3.6-35b-a3b")
    (h100,) = peers.llama_bench_records([dict(TG, gpu_info="NVIDIA H100 80GB HBM3")], model="qwen3.6-35b-a3b")
    assert h100["gbps"] == h200["gbps"]  # the bytes a step moves do not depend on the GPU; the ceiling does
    assert h100["roofline_pct"] == pytest.approx(h200["roofline_pct"] * 4.29 / 3.00, rel=1e-3)
    (other,) = peers.llama_bench_records([dict(TG, gpu_info="NVIDIA L4")], model="qwen3.6-35b-a3b")
    assert other["gbps"] is None and other["roofline_pct"] is None


def test_llama_bench_other_models_combined_tests_and_overrides():
    pg = dict(PP, n_gen=128, model_filename="/x/other.gguf", model_type="qwen35 9B Q8_0")
    (rec,) = peers.llama_bench_records([pg])
    assert (rec["test"], rec["n"], rec["model"], rec["quant"]) == ("pg", 640, "other", "q8_0")
    assert rec["gbps"] is None and "pp512+tg128" in rec["notes"]
    (rec,) = peers.llama_bench_records([dict(TG, samples_ts=[])], model="m", quant="q4km")
    assert rec["tok_s"] == 249.3 and rec["quant"] == "q4km"  # no samples: llama-bench's mean


# One line of `llama-bench -o jsonl` as printed by the vendored llama.cpp (CPU build, tiny-moe q8_0 export).
REAL_JSONL = (
    '{"build_commit": "unknown", "build_number": 0, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "CPU", '
    '"model_filename": "/tmp/tm-q8.gguf", "model_type": "qwen35moe ?B Q8_0", "model_size": 831488, '
    '"model_n_params": 757584, "n_batch": 2048, "n_ubatch": 512, "n_threads": 1, "cpu_mask": "0x0", '
    '"cpu_strict": false, "poll": 50, "type_k": "f16", "type_v": "f16", "n_gpu_layers": -1, "n_cpu_moe": 0, '
    '"split_mode": "layer", "main_gpu": 0, "no_kv_offload": false, "flash_attn": -1, "devices": "auto", '
    '"tensor_split": "0.00", "tensor_buft_overrides": "none", "load_mode": "auto", "lazy_mode": "auto", '
    '"embeddings": false, "no_op_offload": 0, "no_host": false, "repack": true, "fit_target": 0, "fit_min_ctx": 0, '
    '"n_prompt": 0, "n_gen": 16, "n_depth": 32, "test_time": "2026-11-29T15:51:53Z", "avg_ns": 2768496, '
    '"stddev_ns": 87361, "avg_ts": 23128.747634, "stddev_ts": 729.576183, "samples_ns": [ 2706745, 2830248 ],'
    '"samples_ts": [ 23644.6, 22612.9 ]}'
)


def test_real_llama_bench_line_from_a_cpu_build():
    (rec,) = peers.llama_bench_records(peers.read_llama_bench(REAL_JSONL + "\n"), model="tiny-moe",
                                       peer_version="llama-cpp-python 0.3.36 sdist")
    assert (rec["test"], rec["n"], rec["depth"], rec["quant"], rec["gpu"]) == ("tg", 16, 32, "q8_0", "AMD EPYC")
    assert rec["tok_s"] == pytest.approx((23644.6 + 22612.9) / 2) and rec["reps"] == 2
    assert "unknown (build 0) llama-cpp-python 0.3.36 sdist, CPU" in rec["notes"]
    assert rec["gbps"] is None  # no measured copy bandwidth for this device: no roofline


def test_llama_bench_bad_input_is_named():
    with pytest.raises(ValueError, match="line 2 is neither"):
        peers.read_llama_bench('{"n_prompt": 1, "n_gen": 0, "avg_ts": 1}\nnot json', "out.jsonl")
    with pytest.raises(ValueError, match="test 0 lacks n_gen, avg_ts"):
        peers.read_llama_bench('[{"n_prompt": 512}]', "out.json")
    with pytest.raises(ValueError, match="empty"):
        peers.read_llama_bench("  ", "out.json")


def test_llama_bench_command_appends_records(tmp_path, capsys):
    src = tmp_path / "lb.json"
    src.write_text(json.dumps([PP, TG]))
    assert peers.main(["llama-bench", str(src), "--model", "qwen3.6-35b-a3b", "--results", str(tmp_path / "r")]) == 0
    (out,) = (tmp_path / "r").glob("*.jsonl")
    assert [json.loads(line)["test"] for line in out.read_text().splitlines()] == ["pp", "tg"]
    assert "llama.cpp" in capsys.readouterr().out


# ---- transformers ----------------------------------------------------------------------------------------------
def test_transformers_peer_builds_random_weights_and_keeps_the_cache_depth():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, config = peers.build_transformers_model("tiny-moe", "cpu", torch.float32, seed=0)
    peers.force_torch_kernels(model)  # fla (if installed) has no CPU path
    assert not any(p.is_meta for p in model.parameters())
    inv = model.model.rotary_emb.inv_freq  # rebuilt after to_empty: theta^(-2j/rotary_dim)
    rot = int(config.head_dim * config.rope_parameters["partial_rotary_factor"])
    want = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, rot, 2).float() / rot))
    torch.testing.assert_close(inv, want)
    runner = peers.TransformersRunner(model, "cpu")
    with torch.inference_mode():
        cache = runner._fresh(1, 5)
        assert cache.get_seq_length() == 5
        logits = runner._forward(runner._ids(1, 3), cache).logits
        assert cache.get_seq_length() == 8 and logits.shape == (1, 1, config.vocab_size)
        assert torch.isfinite(logits).all() and logits.std() > 0
    assert len(runner.decode(2, 4, 1, reps=2)) == 2 and len(runner.prefill(4, 0, 2, reps=1)) == 1


def test_transformers_command_on_the_tiny_preset(tmp_path, capsys):
    pytest.importorskip("transformers")
    args = ["transformers", "--preset", "tiny-moe", "-p", "8", "-n", "2", "-d", "0,4", "-r", "2", "--device", "cpu",
            "--dtype", "fp32", "--threads", "1", "--results", str(tmp_path)]
    assert peers.main(args) == 0
    (out,) = tmp_path.glob("cpu-*.jsonl")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["test"], r["n"], r["depth"]) for r in recs] == [("pp", 8, 0), ("tg", 2, 0), ("pp", 8, 4), ("tg", 2, 4)]
    assert all(r["engine"] == "transformers" and r["tok_s"] > 0 and r["reps"] == 2 for r in recs)
    assert "depth by real prefill" in recs[0]["notes"] and "torch functions (forced)" in recs[0]["notes"]
    assert "transformers" in capsys.readouterr().out


# ---- the table ---------------------------------------------------------------------------------------------------
def rec(engine, quant, test, n, depth, tok_s, date="2026-11-29", gpu="NVIDIA H200", model="qwen3.6-35b-a3b"):
    return {"engine": engine, "commit": "c", "date": date, "gpu": gpu, "model": model, "quant": quant, "test": test,
            "n": n, "depth": depth, "batch": 1, "tok_s": tok_s, "tok_s_std": 1.0, "reps": 3, "notes": ""}


def test_table_puts_engines_side_by_side_with_ratios(tmp_path):
    lines = [
        rec("llama.cpp", "q4_k_m", "tg", 128, 0, 250.0),
        rec("deltaserve", "q4g64", "tg", 128, 0, 400.0, date="2026-11-28"),
        rec("deltaserve", "q4g64", "tg", 128, 0, 500.0),  # the latest record of a cell wins
        rec("transformers", "bf16", "tg", 128, 0, 20.0),
        rec("deltaserve", "q4g64", "pp", 512, 512, 9000.0),
        rec("transformers", "bf16", "pp", 512, 512, 3000.0),
        rec("deltaserve", "q4g64", "tg", 128, 0, 1.0, gpu="other"),
        {"engine": "deltaserve", "kernel": "affine_matmul", "us": 22.4},  # kernel timings are not throughput rows
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    table = peers.side_by_side(peers.load_records([path]), gpu="NVIDIA H200")
    head, rule, pp_row, tg_row, blank, *footer = table.splitlines()
    assert blank == "" and len(footer) == 3 and footer[0].startswith("deltaserve q4g64: records of deltaserve tree c;")
    assert head.index("deltaserve q4g64") < head.index("llama.cpp q4_k_m") < head.index("transformers bf16")
    assert "ds/llama.cpp q4_k_m" in head and "ds/transformers bf16" in head
    assert "pp512 @ d512" in pp_row and "3.00x" in pp_row and pp_row.count("|") == head.count("|")
    assert "500.00 ± 1.00" in tg_row and "2.00x" in tg_row and "25.00x" in tg_row and "400.00" not in tg_row
    assert peers.side_by_side([], gpu="x") == "no benchmark records for gpu 'x'"


def test_table_keeps_one_deltaserve_commit_when_asked(tmp_path):
    old, new, peer = (rec("deltaserve", "q4g64", "tg", 128, 0, 400.0), rec("deltaserve", "q4g64", "tg", 128, 4, 450.0),
                      rec("llama.cpp", "q4_k_m", "tg", 128, 0, 250.0))
    old["commit"], new["commit"], peer["commit"] = "aaa111", "bbb222", "zzz"
    table = peers.side_by_side([old, new, peer], commit="bbb")
    rows = table.splitlines()
    assert "400.00" not in table and "450.00" in table  # the other commit's cell is dropped, not mixed in
    assert any("250.00" in r for r in rows)  # peers are kept whatever their commit field
    assert "records of deltaserve tree bbb222" in table


def test_table_command_reads_the_results_dir(tmp_path, capsys, monkeypatch):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "a.jsonl").write_text(json.dumps(rec("deltaserve", "q4g64", "tg", 128, 0, 9.0)))
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    monkeypatch.chdir(tmp_path)
    assert peers.main(["table"]) == 0
    assert "9.00 ± 1.00" in capsys.readouterr().out
    with pytest.raises(ValueError, match="bad.jsonl:1: not a JSON line"):
        peers.main(["table", str(tmp_path / "bad.jsonl")])
