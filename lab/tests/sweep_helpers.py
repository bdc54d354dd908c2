"""What the sweep scripts' CPU tests share: a dry run of a script (a child process; the script re-runs itself
under Triton's interpreter) and an environment that patches the library first through a sitecustomize (a canary
the script's checks must catch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dry_run(script: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--dry-run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env or dict(os.environ), check=False)


def canary_env(tmp_path: Path, sitecustomize: str) -> dict:
    """os.environ with a sitecustomize (its source given) first on PYTHONPATH, then the repository."""
    (tmp_path / "sitecustomize.py").write_text(sitecustomize)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
