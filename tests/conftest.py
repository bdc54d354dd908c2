"""Test-session setup shared by every test file.

Under pytest-xdist (the README's test command: one worker per core, one test file per worker) each worker gets an
equal share of the cores for torch's intra-op threads, and so do the child processes the interpreter tests start
(OMP_NUM_THREADS, inherited): two workers on two cores, each spinning two OpenMP threads, made the slowest
interpreter test ~35% slower than alone.
"""

from __future__ import annotations

import os

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
if _WORKERS > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_THREADS))

import torch  # noqa: E402  (after the thread variables: they are read when torch starts its pool)

if _WORKERS > 1:
    torch.set_num_threads(_THREADS)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say that the GPU tests were left out (pyproject's addopts: -m 'not gpu') and how to run them: a green run on
    a CPU machine has not run them. Counted from the deselected items where this process collected them; under
    pytest-xdist the workers collect, and the line says so without a count."""
    markexpr = config.option.markexpr or ""
    deselected = terminalreporter.stats.get("deselected", [])
    gpu = sum(1 for item in deselected if "gpu" in getattr(item, "keywords", ()))
    how = "run `python -m pytest -m gpu tests/gpu` on a GPU machine (lab/README.md says how)"
    if gpu:
        terminalreporter.write_line(f"{gpu} gpu tests deselected: {how}")
    elif "not gpu" in markexpr and getattr(config, "workerinput", None) is None and config.pluginmanager.hasplugin(
            "dsession"):
        terminalreporter.write_line(f"the gpu tests were deselected (-m '{markexpr}'): {how}")
