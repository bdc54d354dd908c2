"""The kernels' launch constants as data (deltaserve/kernels/launch_table.py): the default table declares every
constant with a doc, a GPU's file overrides values and shape entries of declared constants only, shape keys name
weight dimensions (never a row count), the most specific shape entry wins, overrides last for their block, every
constant is read somewhere in the package, and docs/launch_table.md is generated and current."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deltaserve.kernels import launch_table as lt
from deltaserve.model.plan import resolve_plan

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path, default: dict, gpu: dict | None = None, gpu_name: str = "NVIDIA H100 80GB HBM3") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / lt.DEFAULT_FILE).write_text(json.dumps({"constants": default}))
    if gpu is not None:
        (folder / f"{lt.gpu_file_stem(gpu_name)}.json").write_text(json.dumps({"gpu": gpu_name, "constants": gpu}))
    return folder


def test_default_table_declares_every_constant_with_a_doc():
    tab = lt.load(None)
    assert tab.name == "default" and len(tab.constants) >= 40
    for name, c in tab.constants.items():
        assert re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+", name), f"{name}: names are op.snake_case"
        assert c.doc.endswith("."), f"{name}: one documented line ending in a period"
        assert not isinstance(c.value, list), f"{name}: lists are read as tuples"


def test_every_constant_is_read_by_the_package():
    """No stale entry: each name is asked for in deltaserve/ (literally, or as an f-string's prefix for the
    per-kind ones: attention.decode_warps_{kind})."""
    sources = "\n".join(p.read_text() for p in (ROOT / "deltaserve").rglob("*.py"))
    unread = [n for n in lt.load(None).constants
              if f'"{n}"' not in sources and f'"{n.rsplit("_", 1)[0]}_{{' not in sources]
    assert not unread, f"launch constants nothing reads: {unread}"


def test_gpu_file_overrides_values_and_shapes(tmp_path):
    folder = _write(tmp_path, {
        "op.rows": {"value": 17, "doc": "Rows.", "shapes": {"K=4096": 9}},
        "op.stages": {"value": [[8, 5]], "doc": "Stages."},
        "op.cap": {"value": None, "doc": "A cap."},
    }, gpu={"op.rows": {"shapes": {"K=4096,bits=4": 7, "K=1024": 33}}, "op.cap": {"value": 128}})
    base = lt.load(None, folder)
    assert (base.get("op.rows"), base.get("op.rows", K=4096), base.get("op.rows", K=2048)) == (17, 9, 17)
    assert base.get("op.stages") == ((8, 5),) and base.get("op.cap") is None
    own = lt.load("NVIDIA H100 80GB HBM3", folder)
    assert own.name == "default+NVIDIA_H100_80GB_HBM3" and own.gpu == "NVIDIA H100 80GB HBM3"
    assert own.get("op.rows") == 17 and own.get("op.rows", K=1024) == 33
    assert own.get("op.rows", K=4096) == 9 and own.get("op.rows", K=4096, bits=4) == 7  # the most specific wins
    assert own.get("op.cap") == 128 and own.get("op.stages") == ((8, 5),)
    assert lt.load("NVIDIA H200", folder).name == "default"  # a GPU without a file of its own: the default
    with pytest.raises(ValueError, match="not weight dimensions"):
        own.get("op.rows", M=4)  # a launch's row count is never a key
    with pytest.raises(KeyError, match="'op.nope' is not a launch constant"):
        own.get("op.nope")


@pytest.mark.parametrize("default, gpu, match", [
    ({"op.a": {"value": 1}}, None, "constant op.a: expected an object with 'value' and a non-empty 'doc'"),
    ({"op.a": {"value": 1, "doc": "A.", "shapes": {"M=4": 2}}}, None,
     r"shape key 'M=4' must be NAME=INT .* \(weight dimensions: never a row count\)"),
    ({"op.a": {"value": 1, "doc": "A.", "shapes": {"K=64": 2, "N=32": 3}}}, None, "tie for a shape"),
    ({"op.a": {"value": 1, "doc": "A.", "shapes": {"K=64": "wide"}}}, None, "not of the value's type"),
    ({"op.a": {"value": 1, "doc": "A."}}, {"op.b": {"value": 2}}, r"NVIDIA_H100_80GB_HBM3.json, constant op.b: not "
                                                                     "declared in default.json"),
    ({"op.a": {"value": 1, "doc": "A."}}, {"op.a": {"value": "2"}}, r"value '2' is not of the default's type \(1\)"),
    ({"op.a": {"value": 1, "doc": "A."}}, {"op.a": {"valu": 2}}, "expected an object of 'value' and/or 'shapes'"),
])
def test_bad_tables_are_refused_naming_file_and_constant(tmp_path, default, gpu, match):
    folder = _write(tmp_path, default, gpu)
    with pytest.raises(ValueError, match=match):
        lt.load("NVIDIA H100 80GB HBM3", folder)


def test_unreadable_table_names_the_file(tmp_path):
    (tmp_path / lt.DEFAULT_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"default.json: cannot be read as JSON"):
        lt.load(None, tmp_path)


def test_override_lasts_for_its_block():
    before = lt.value("attention.merge_bsp")
    with lt.override({"attention.merge_bsp": 4}):
        assert lt.value("attention.merge_bsp") == 4
        with lt.override({"attention.merge_bsp": 2}):
            assert lt.value("attention.merge_bsp") == 2
        assert lt.value("attention.merge_bsp") == 4
    assert lt.value("attention.merge_bsp") == before
    with pytest.raises(KeyError, match="not launch constants .*'attention.merge_bps'"):
        with lt.override({"attention.merge_bps": 4}):
            pass


def test_the_process_table_is_bound_once():
    """value() reads the process's table, bound at the first lookup (no device query per launch)."""
    tab = lt.table()
    assert lt.table() is tab and tab.name == lt._table_of(lt.current_gpu()).name
    assert lt.value("attention.merge_bsp") == tab.get("attention.merge_bsp")


def test_the_plan_names_the_table():
    plan = resolve_plan()
    assert plan.launch_table == lt.table().name
    assert f"launch_table={plan.launch_table}" in plan.describe()
    assert any("launch constants" in line for line in plan.details())


def test_docs_are_generated_and_current():
    doc = (ROOT / "docs" / "launch_table.md").read_text()
    assert doc == lt.markdown(), ("docs/launch_table.md is stale: "
                                  "python -m deltaserve.kernels.launch_table > docs/launch_table.md")
