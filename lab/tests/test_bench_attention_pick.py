"""lab/bench_attention_pick.py: the pick rules on synthetic sweep records (the default is the first
configuration; a faster one at batch 1 and the deepest context wins unless it is slower elsewhere or failed)."""

from __future__ import annotations

import importlib.util

from sweep_helpers import ROOT

_spec = importlib.util.spec_from_file_location("bench_attention_pick", ROOT / "lab" / "bench_attention_pick.py")
pick_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pick_mod)


def _recs(config, split, times, kv="fp8", ok=True):
    return [dict(config=config, kv=kv, split=split, bn=None, warps=4, stages=None, merge_bsp=32, merge_bd=64,
                 batch=b, depth=d, us=us, ok=ok) for (b, d), us in times.items()]


BASE = {(1, 32768): 40.0, (1, 512): 9.0, (8, 32768): 170.0, (8, 512): 14.0}


def test_fastest_at_depth_wins():
    recs = _recs("default", 128, BASE) + _recs("a", 256, {**BASE, (1, 32768): 30.0}) + \
        _recs("b", 64, {**BASE, (1, 32768): 25.0})
    assert pick_mod.pick(recs, "fp8")["config"] == "b" and pick_mod.pick(recs, "fp8")["split"] == 64


def test_slower_elsewhere_failed_or_other_kind_loses():
    recs = (_recs("default", 128, BASE)
            + _recs("shallow", 128, {**BASE, (1, 32768): 20.0, (1, 512): 9.5})  # +0.5 us at batch 1, 512 tokens
            + _recs("b8", 128, {**BASE, (1, 32768): 20.0, (8, 32768): 180.0})  # +5.9% at batch 8
            + _recs("bad", 128, {**BASE, (1, 32768): 10.0}, ok=False)
            + _recs("bf16", 128, {**BASE, (1, 32768): 10.0}, kv="bf16")
            + _recs("partial", 128, {(1, 32768): 10.0, (1, 512): 9.0}))  # not run at every shape
    assert pick_mod.pick(recs, "fp8") is None
    recs += _recs("fine", 128, {**BASE, (1, 32768): 35.0, (1, 512): 9.2, (8, 32768): 175.0})
    assert pick_mod.pick(recs, "fp8")["config"] == "fine"


def test_settings_and_set_option(capsys):
    chosen = pick_mod.pick(_recs("default", 128, BASE) + _recs("a", 64, {**BASE, (1, 32768): 30.0}), "fp8")
    values = pick_mod.knob_settings(chosen)
    assert values["SPLIT_TOKENS"] == 64 and values["DECODE_STAGES"] == {"bf16": None, "fp8": None}
    assert values["DECODE_WARPS"] == {"bf16": 4, "fp8": 4}
    assert pick_mod.main(["--set", "MERGE_BSP=32", "--set", "DECODE_STAGES={'bf16': 3}", "--print-only"]) == 0
    assert "{'MERGE_BSP': 32, 'DECODE_STAGES': {'bf16': 3}}" in capsys.readouterr().out
