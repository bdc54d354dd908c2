"""Test-session setup shared by every test file.

Under pytest-xdist (the README's test command: one worker per core, one test file per worker) each worker gets an
equal share of the cores for torch's intra-op threads, so that two workers on two cores do not each spin two threads.
"""

from __future__ import annotations

import os

import torch


def _share_cores_between_workers() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


_share_cores_between_workers()
