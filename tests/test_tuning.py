"""The environment registry (deltaserve/utils/tuning.py): every variable the package names is declared there, no
other module reads the environment, docs/tuning.md is generated from it and current, and values are typed and
checked with errors that name the variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from deltaserve.utils import tuning

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "deltaserve"


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "utils" / "tuning.py")


def test_no_module_but_the_registry_reads_the_environment():
    readers = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                name = node.attr
            elif isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
                name = node.id
            if name:
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno} ({name})")
    assert not readers, "read the environment through deltaserve.utils.tuning only: " + ", ".join(readers)


def test_every_variable_named_in_the_package_is_declared():
    declared = {v.name for v in tuning.VARIABLES}
    named = {m for path in _sources() for m in re.findall(r"\bDELTASERVE_[A-Z0-9_]+\b", path.read_text())}
    assert named <= declared, f"undeclared: {sorted(named - declared)}"
    assert len(declared) == len(tuning.VARIABLES), "a variable declared twice"
    assert all(v.doc and v.doc.endswith(".") for v in tuning.VARIABLES)


def test_docs_are_generated_and_current():
    doc = (ROOT / "docs" / "tuning.md").read_text()
    assert doc == tuning.markdown(), "docs/tuning.md is stale: python -m deltaserve.utils.tuning > docs/tuning.md"
    for v in tuning.VARIABLES:
        assert f"`{v.name}`" in doc


def test_typed_values_and_errors(monkeypatch):
    monkeypatch.delenv("DELTASERVE_PDL", raising=False)
    assert tuning.get("DELTASERVE_PDL") is True
    for raw, want in (("0", False), ("off", False), ("1", True), ("  yes ", True), ("", True)):
        monkeypatch.setenv("DELTASERVE_PDL", raw)
        assert tuning.get("DELTASERVE_PDL") is want
    monkeypatch.setenv("DELTASERVE_PDL", "maybe")
    with pytest.raises(ValueError, match="DELTASERVE_PDL must be 0 or 1, found 'maybe'"):
        tuning.get("DELTASERVE_PDL")
    monkeypatch.setenv("DELTASERVE_ATTN_LONG_SPLIT", "8192")
    with pytest.raises(ValueError, match="DELTASERVE_ATTN_LONG_SPLIT must be off or FROMxTILES"):
        tuning.get("DELTASERVE_ATTN_LONG_SPLIT")
    monkeypatch.setenv("DELTASERVE_ROUTER_ROW_BLOCKS", "65")
    with pytest.raises(ValueError, match=r"DELTASERVE_ROUTER_ROW_BLOCKS must be an integer in \[1, 64\], found '65'"):
        tuning.get("DELTASERVE_ROUTER_ROW_BLOCKS")
    with pytest.raises(KeyError, match="DELTASERVE_MOE_TOPK is not a declared deltaserve variable"):
        tuning.get("DELTASERVE_MOE_TOPK")


def test_set_in_environment_names_what_a_record_should_say(monkeypatch):
    for v in tuning.VARIABLES:
        monkeypatch.delenv(v.name, raising=False)
    monkeypatch.setenv("DELTASERVE_PDL", "0")
    monkeypatch.setenv("DELTASERVE_COMMIT", "abc1234")  # the record's own field, not a kernel choice
    monkeypatch.setenv("DELTASERVE_GONE", "1")  # not declared: not ours to report
    assert tuning.set_in_environment() == {"DELTASERVE_PDL": "0"}
