"""Starting the ranks of a tensor-parallel engine: one process per device, joined by torch.distributed.

Two launches (vLLM's `distributed_executor_backend` spellings):
- "mp" (the default): the process that builds the `LLM` is rank 0; it starts ranks 1..N-1 itself as fresh Python
  interpreters (`tp_steps.worker_main`), which rendezvous through a file in a private temporary directory (no port to
  pick). Rank r uses cuda:r (CPU: every rank on the host). A worker also ends when rank 0's process is gone.
- "external_launcher": every rank was started by `torchrun` (or another launcher that sets torch.distributed's
  environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE); each builds the `LLM` itself. Rank r uses cuda:(r mod the
  node's GPU count), i.e. ranks numbered node by node, as torchrun does. Rank 0's constructor returns a working LLM;
  on the others it serves rank 0's steps and returns once rank 0 shuts down (`LLM.is_driver` is then False).

Two process groups: the model's collectives (NCCL between GPUs, gloo on CPU) time out after `timeout_s`; the step
messages of engine/tp_steps.py go over a gloo group without a practical timeout (a worker waits as long as the driver
is idle) - a peer that exits closes its sockets, which gloo reports at once, so a dead driver still ends its workers.
Rank 0 also watches its spawned workers' exit codes before every step. Either way every rank exits with a
`ParallelError` naming the rank and the cause, never a hang.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..model.parallel import Parallel, ParallelError, TorchCommunicator

BACKENDS = ("mp", "external_launcher")
IDLE_TIMEOUT = datetime.timedelta(days=365)  # the step channel: workers wait while the driver is idle


@dataclass(frozen=True)
class ParallelOptions:
    """The LLM / CLI choices (vLLM spellings)."""

    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    distributed_executor_backend: str | None = None  # None: "mp"
    timeout_s: float = 600.0  # a collective that waits longer fails on every rank

    def check(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, found {self.tensor_parallel_size}")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"distributed_executor_backend {backend!r} is not supported; use one of "
                             f"{', '.join(BACKENDS)}")
        if self.enable_expert_parallel and self.tensor_parallel_size == 1:
            raise ValueError("enable_expert_parallel partitions the experts over the tensor-parallel ranks: it needs "
                             "tensor_parallel_size > 1")
        if self.timeout_s <= 0:
            raise ValueError(f"the distributed timeout must be positive, found {self.timeout_s}")

    def check_for(self, config, speculative_tokens: int = 0) -> None:
        """check(), and that the model can be split this way (sizes named), before anything is loaded or started."""
        from ..model.tp_layout import TPLayout

        self.check()
        if self.tensor_parallel_size > 1:
            TPLayout(config, 0, self.tensor_parallel_size, self.enable_expert_parallel)
            if speculative_tokens:
                raise ValueError("speculative_tokens with tensor_parallel_size > 1 is not supported: the MTP draft "
                                 "head and the verification forward are not split (docs/parallel.md)")


@dataclass
class Ranks:
    """This process's place among the ranks, its groups and (rank 0 under "mp") the workers it started."""

    rank: int
    size: int
    device: torch.device
    parallel: Parallel
    control: object  # the gloo group of the step messages
    data: object  # the model's group (NCCL or gloo)
    workers: list = field(default_factory=list)  # rank 0 under "mp": the started processes, rank r at index r-1
    tmpdir: str | None = None
    closed: bool = False
    host_threads: int | None = None  # CPU under "mp": torch's threads before the host's cores were divided

    # ---- failures ----------------------------------------------------------------------------------------------
    def dead_workers(self) -> list[str]:
        """One line per started worker that has exited, with what it reported (rank 0 under "mp")."""
        lines = []
        for r, proc in enumerate(self.workers, start=1):
            if proc.poll() is not None:
                why = ""
                try:
                    with open(os.path.join(self.tmpdir, f"rank{r}.err")) as f:
                        why = f": {f.read()}"
                except OSError:
                    pass
                lines.append(f"rank {r} (pid {proc.pid}) exited with status {proc.returncode}{why}")
        return lines

    def check_workers(self) -> None:
        """Raise if the ranks were stopped or a spawned worker has exited (called before every step)."""
        if self.closed:
            raise ParallelError("the tensor-parallel engine was shut down, or stopped by an earlier failure")
        dead = self.dead_workers() if self.workers else []
        if dead:
            self.abort()
            raise ParallelError("tensor-parallel engine stopped: " + "; ".join(dead))

    def explain(self, error: BaseException) -> ParallelError:
        """A ParallelError for a failed collective, with the workers' exit codes when rank 0 started them (a peer's
        sockets close a moment before its exit is visible: waits up to 5 s for it)."""
        dead = self.dead_workers() if self.workers else []
        deadline = time.monotonic() + 5
        while self.workers and not dead and time.monotonic() < deadline:
            time.sleep(0.05)
            dead = self.dead_workers()
        self.abort()
        return ParallelError(f"{error}" + (f" ({'; '.join(dead)})" if dead else ""))

    # ---- the end -----------------------------------------------------------------------------------------------
    def abort(self) -> None:
        """After a failure: stop the spawned workers (they would fail their next collective anyway)."""
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._release()

    def join_workers(self, timeout_s: float = 60.0) -> None:
        for proc in self.workers:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._release()

    def _release(self) -> None:
        if self.closed:
            return
        self.closed = True
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group after a peer's death: nothing left to release
                pass
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self.host_threads is not None:
            torch.set_num_threads(self.host_threads)


# ---- process groups --------------------------------------------------------------------------------------------


def rank_device(device: str, rank: int, external: bool) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda" or dev.index is not None:
        raise ValueError(f"tensor parallelism places rank r on cuda:r: pass device 'cuda' (or 'cpu'), found {device!r}")
    count = torch.cuda.device_count()
    if not external and rank >= count:
        raise ValueError(f"tensor_parallel_size needs a GPU per rank: rank {rank} has none ({count} visible)")
    return torch.device("cuda", rank % count)


def join_group(rank: int | None, size: int, device: str, init_method: str | None, options: ParallelOptions
               ) -> Ranks:
    """Initialise torch.distributed for this rank and make the two groups. rank None, init_method None: the
    launcher's environment says which rank this is (the device is picked after the rendezvous)."""
    import torch.distributed as dist

    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if rank is not None:
        dev = rank_device(device, rank, external=False)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
    kwargs = dict(backend=backend, timeout=datetime.timedelta(seconds=options.timeout_s))
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=rank, world_size=size)
    elif dist.is_initialized():
        raise ValueError("torch.distributed is already initialised in this process")
    dist.init_process_group(**kwargs)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != size:
        dist.destroy_process_group()
        raise ValueError(f"tensor_parallel_size {size} but the launcher started {world} processes")
    if init_method is None:  # NCCL makes its communicators at the first collective, on the current device
        dev = rank_device(device, rank, external=True)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    comm = TorchCommunicator(dist.group.WORLD, rank, size, options.timeout_s)
    parallel = Parallel(rank, size, comm, options.enable_expert_parallel)
    return Ranks(rank, size, dev, parallel, control, dist.group.WORLD)


@dataclass(frozen=True)
class WorkerSpec:
    """What a spawned worker needs to load its shard (picklable)."""

    rank: int
    size: int
    init_method: str
    model_dir: str
    device: str
    dtype: torch.dtype | None
    options: ParallelOptions
    threads: int
    parent_pid: int
    error_file: str  # where the worker writes why it stopped, for rank 0's error


def start_ranks(model_dir: str | Path, device: str, dtype: torch.dtype | None, options: ParallelOptions) -> Ranks:
    """This process's Ranks: under "mp" rank 0, after starting ranks 1..N-1; under "external_launcher" whichever rank
    the launcher made it."""
    options.check()
    if options.distributed_executor_backend == "external_launcher":
        return join_group(None, options.tensor_parallel_size, device, None, options)
    return _spawn(model_dir, device, dtype, options)


def _spawn(model_dir, device: str, dtype, options: ParallelOptions) -> Ranks:
    """Start ranks 1..N-1 as fresh interpreters (`python -c` running worker_main on a pickled WorkerSpec), then join
    them as rank 0. Fresh interpreters, not multiprocessing's spawn: that re-imports the caller's __main__ script, so
    every script (and notebook) would need a main guard."""
    size = options.tensor_parallel_size
    for r in range(size):
        rank_device(device, r, external=False)  # every rank has its GPU, before anything starts
    host_threads = threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":  # the ranks share the host's cores: oversubscribed OpenMP threads spin
        threads = max(1, threads // size)  # while a peer waits in a collective (50x slower steps on 2 cores)
        torch.set_num_threads(threads)
    tmpdir = tempfile.mkdtemp(prefix="deltaserve-tp-")
    init_method = "file://" + os.path.join(tmpdir, "rendezvous")
    root = str(Path(__file__).resolve().parents[2])  # the directory holding this deltaserve package
    workers = []
    for r in range(1, size):
        spec = WorkerSpec(r, size, init_method, str(model_dir), device, dtype, options, threads,
                          os.getpid(), os.path.join(tmpdir, f"rank{r}.err"))
        spec_file = os.path.join(tmpdir, f"rank{r}.spec")
        with open(spec_file, "wb") as f:
            pickle.dump(spec, f)
        code = (f"import sys; sys.path.insert(0, {root!r}); from deltaserve.engine.tp_steps import worker_main; "
                f"worker_main({spec_file!r})")
        workers.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL))
    try:
        ranks = join_group(0, size, device, init_method, options)
    except BaseException:
        for proc in workers:
            proc.kill()
        shutil.rmtree(tmpdir, ignore_errors=True)
        torch.set_num_threads(host_threads)
        raise
    ranks.workers, ranks.tmpdir, ranks.host_threads = workers, tmpdir, host_threads
    atexit.register(ranks.abort)  # an interpreter that exits without LLM.shutdown() still ends its workers
    return ranks


def watch_parent(pid: int, rank: int) -> None:
    """End this worker when the process that started it is gone (it may have died before the rendezvous, when no
    collective would notice)."""
    import threading

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(0.5)
        print(f"deltaserve: tensor-parallel rank {rank}: rank 0 (pid {pid}) exited; stopping", file=sys.stderr,
              flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="deltaserve-parent-watch", daemon=True).start()
