"""Import direction: utils <- kernels <- model, quant <- weights <- synthetic <- engine <- cli/server/bench.

Every module under deltaserve/ is parsed (ast, nothing imported); each deltaserve import it makes, at top level or
inside a function, must point to its own layer or one to its left. model and quant share a layer but may not import
each other. The package root (deltaserve/__init__.py: the public API) sits with cli.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import deltaserve

ROOT = Path(deltaserve.__file__).parent
RANK = {
    "utils": 0,
    "kernels": 1,
    "model": 2,
    "quant": 2,
    "weights": 3,
    "synthetic": 4,
    "structured": 4,  # structured output (grammars over token ids): tokenizers + xgrammar; the engine and server use it
    "engine": 5,
    "cli": 6,
    "server": 6,
    "bench": 6,
    "export": 6,  # GGUF export: reads checkpoints (weights), presets (synthetic); used by cli
    "__main__": 6,
    "": 6,  # deltaserve/__init__.py
}
FORBIDDEN_PAIRS = {("model", "quant"), ("quant", "model")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def top_package(module: str) -> str:
    """deltaserve.model.config -> model; deltaserve -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every deltaserve import in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or target == "deltaserve":  # `from . import x`: x are submodules
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, t) for line, t in found if t == "deltaserve" or t.startswith("deltaserve.")]


def violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        src = top_package(module_name(path))
        if src not in RANK:
            bad.append(f"{path}: package '{src}' has no layer (add it to RANK in tests/test_layering.py)")
            continue
        for line, target in imports_of(path):
            dst = top_package(target)
            if dst == src:
                continue
            if dst not in RANK:
                bad.append(f"{path}:{line}: imports {target}, whose package has no layer")
            elif RANK[dst] > RANK[src] or (src, dst) in FORBIDDEN_PAIRS:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {src or 'deltaserve'} may not import {target}")
    return bad


def test_imports_follow_the_layers():
    assert violations() == []


def test_the_checker_catches_a_wrong_direction(tmp_path, monkeypatch):
    pkg = tmp_path / "deltaserve"
    (pkg / "model").mkdir(parents=True)
    (pkg / "engine").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text("")
    (pkg / "model" / "bad.py").write_text("def f():\n    from ..engine import scheduler\n")
    (pkg / "model" / "worse.py").write_text("import deltaserve.quant.affine\n")
    (pkg / "engine" / "fine.py").write_text("from ..model import bad\nfrom deltaserve.kernels import sampling\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    found = violations()
    assert any("model may not import deltaserve.engine" in v for v in found)
    assert any("model may not import deltaserve.quant.affine" in v for v in found)
    assert not any("fine.py" in v for v in found)
