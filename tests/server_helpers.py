"""Shared pieces of the server tests: the tiny checkpoint, a server on 127.0.0.1 in a thread of the test process, and
a model wrapper that forces a reply's text (a tiny random model never writes a tool call by itself).

ForcedTextModel runs the real model (so the caches and the engine path are the real ones) and then, while `script`
is set, replaces each sampled row's logits so that output token j of every request is script[j] (then <|im_end|>).
It tells requests apart by their DeltaNet state slot: a sequence whose context starts at 0 is a new request in that
slot, and its first sampled position marks where its output begins. A prefix-cache hit starts a request past 0, so
a forcing server runs without the prefix cache (Served.force checks).
"""

from __future__ import annotations

import bisect
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch
import uvicorn

from deltaserve.engine.llm import LLM
from deltaserve.server.app import build_app
from deltaserve.server.launch import build_state
from deltaserve.server.serving import ServerConfig
from deltaserve.synthetic import make_checkpoint

MODEL_NAME = "tiny"


def tiny_checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-moe"), "tiny-moe", seed=0, dtype="fp32", progress=False)


class ForcedTextModel(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, stop_id: int):
        super().__init__()
        self.inner = inner
        self.stop_id = stop_id
        self.script: list[int] | None = None
        self._out_start: dict[int, int | None] = {}  # state slot -> cache index of its request's first output

    @property
    def config(self):
        return self.inner.config

    def make_cache(self, *args, **kwargs):
        return self.inner.make_cache(*args, **kwargs)

    def forward(self, batch, cache) -> torch.Tensor:
        logits = self.inner(batch, cache)
        cu = [0]
        for n in batch.seq_lens_cpu:
            cu.append(cu[-1] + n)
        slots = batch.state_slots.tolist()
        for b, ctx in enumerate(batch.context_lens_cpu):
            if ctx == 0:
                self._out_start[slots[b]] = None
        for row, t in enumerate(batch.logits_indices.tolist()):
            b = bisect.bisect_right(cu, t) - 1
            slot, pos = slots[b], batch.context_lens_cpu[b] + t - cu[b]
            if self._out_start.get(slot) is None:
                self._out_start[slot] = pos + 1
            j = pos + 1 - self._out_start[slot]
            if self.script is not None:
                token = self.script[j] if j < len(self.script) else self.stop_id
                logits[row] = 0.0
                logits[row, token] = 100.0
        return logits


class ServerThread:
    """The app under uvicorn in a daemon thread, on a free port of 127.0.0.1."""

    def __init__(self, app):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Served:
    """A running test server: its URL, state (engine, metrics), and the forcing model."""

    def __init__(self, ckpt, api_key: str | None = None, max_queued_requests: int | None = 1024,
                 max_request_bytes: int = 1 << 20, forcing: bool = True, **engine):
        """forcing: serve through ForcedTextModel (text only, no vision tower); else the checkpoint's own LLM."""
        base = LLM(ckpt, **engine)
        self.forced = None
        self.llm = base
        if forcing:
            self.forced = ForcedTextModel(base.engine.model, base.get_tokenizer().token_to_id("<|im_end|>"))
            self.llm = LLM.from_model(self.forced, base.tokenizer_info, **{k: v for k, v in engine.items()
                                                                            if k not in ("dtype", "device")})
        self.tokenizer = base.get_tokenizer()
        config = ServerConfig([MODEL_NAME], api_key=api_key, max_request_bytes=max_request_bytes,
                              model_root=str(ckpt), generation_defaults={})
        self.state = build_state(self.llm, config, max_queued_requests)
        self.thread = ServerThread(build_app(self.state)).start()
        self.url = self.thread.url

    def force(self, text: str | None) -> None:
        assert text is None or self.llm.engine.prefix_cache is None, "forcing needs enable_prefix_caching=False"
        if self.forced is None:
            assert text is None, "this server was started with forcing=False"
            return
        self.forced.script = None if text is None else self.tokenizer.encode(text, add_special_tokens=False).ids

    def idle_and_free(self, timeout: float = 10.0) -> bool:
        """Wait until the engine holds no request, every KV block and state slot is free."""
        s = self.llm.engine.scheduler
        deadline = time.time() + timeout
        while time.time() < deadline:
            stats = self.state.engine.stats
            if (stats.running == stats.waiting == 0 and s.blocks.num_free == s.blocks.num_blocks
                    and s.slots.num_free == s.slots.num_slots and self.state.engine.num_unfinished == 0):
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        self.thread.stop()
        self.state.engine.shutdown()


def rss_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@contextmanager
def served(args: list[str], up_within: float = 120, stop_within: float = 60):
    """`deltaserve serve ARGS --port P` as a child process on a free port of 127.0.0.1, this tree on its path. Yields
    (url, result) once /health answers; on leaving, stops it with SIGINT and sets result["returncode"] and
    result["output"] (stdout and stderr together)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-m", "deltaserve", "serve", *args, "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, result = f"http://127.0.0.1:{port}", {}
    try:
        deadline = time.monotonic() + up_within
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        yield url, result
    finally:
        proc.send_signal(signal.SIGINT)
        result["output"], _ = proc.communicate(timeout=stop_within)
        result["returncode"] = proc.returncode
