"""Does a row's bits depend on how many rows share its forward, at Qwen3.6-35B-A3B q4 shapes (random weights)?

The engine's exactness rests on it (a request alone == among 63 others; a speculative verify row == its decode
step), and the GPU tests check it on tiny models, which never reach the kernels chosen by row count (the
warpgroup GEMV from 17 rows, the warpgroup experts kernel from 144 expert rows, ...). On the H100 a verify forward
of 24 rows gave other tokens than decode steps of 8 (lab/NOTES.md). This probe, per deployment (the kernel plan of
1 and of 64 streams):
  decode  sequence 0's logits in one decode step beside B - 1 other sequences, B = 1 .. 64, against B = 1;
  verify  sequence 0's k + 1 rows (its token and k drafts) in a verify forward beside B - 1 one-row sequences,
          against k + 1 decode steps of sequence 0 alone, row by row.
Every run starts from the same states (restored) and writes the same KV. Prints a table: equal, or the largest
difference and how many logits differ.

  PYTHONPATH=/tmp/site:$PWD python3 lab/probe_row_bits.py --depth 512 --k 2
"""

from __future__ import annotations

import argparse

import torch

from deltaserve.bench.random_model import build_random_model
from deltaserve.model import ForwardBatch, fast
from deltaserve.model.config import ModelConfig
from deltaserve.model.plan import resolve_plan
from deltaserve.synthetic.presets import get_preset

BLOCK = 64
BATCHES = (1, 2, 4, 8, 9, 16, 17, 24, 32, 48, 64)


class Probe:
    def __init__(self, model, depth: int, max_seqs: int, preset: str = "qwen3.6-35b-a3b", seed: int = 0):
        self.model, self.depth = model, depth
        dev = next(model.parameters()).device
        per = -(-(depth + 16) // BLOCK)
        self.cache = model.make_cache(max_seqs * per, BLOCK, max_seqs)
        self.tables = [list(range(b * per, (b + 1) * per)) for b in range(max_seqs)]
        gen = torch.Generator(device=dev).manual_seed(seed)
        with torch.no_grad():
            for pool in (*self.cache.k.values(), *self.cache.v.values()):
                pool.copy_(torch.randn(pool.shape, generator=gen, device=dev).to(pool.dtype))
            for pool in self.cache.conv.values():
                pool.copy_(torch.randn(pool.shape, generator=gen, device=dev).to(pool.dtype))
            for pool in self.cache.ssm.values():
                pool.copy_((torch.randn(pool.shape, generator=gen, device=dev) * 0.1).to(pool.dtype))
        self.saved = [(t, t.clone()) for t in (*self.cache.conv.values(), *self.cache.ssm.values())]
        vocab = model.config.vocab_size
        self.tokens = torch.randint(0, vocab, (max_seqs + 8,), generator=gen, device=dev).tolist()
        self.dev = dev

    def restore(self) -> None:
        for t, copy in self.saved:
            t.copy_(copy)

    @torch.inference_mode()
    def forward(self, rows: list[list[int]], starts: list[int], verify: bool = False) -> torch.Tensor:
        n = len(rows)
        batch = ForwardBatch.build(rows, starts, self.tables[:n], list(range(n)), BLOCK, device=self.dev,
                                   logits="all", verify=verify)
        return self.model(batch, self.cache)

    def decode(self, batch: int) -> torch.Tensor:
        """Sequence 0's logits, one decode step beside batch - 1 others."""
        self.restore()
        return self.forward([[t] for t in self.tokens[:batch]], [self.depth] * batch)[0].clone()

    def verify(self, batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence 0's k + 1 verify rows beside batch - 1 one-row sequences, the same rows as decode steps)."""
        drafts = self.tokens[-k:]
        self.restore()
        rows = [[self.tokens[0]] + drafts] + [[t] for t in self.tokens[1:batch]]
        got = self.forward(rows, [self.depth] * batch, verify=True)[: k + 1].clone()
        self.restore()
        want = [self.forward([[t]], [self.depth + i])[0].clone() for i, t in enumerate([self.tokens[0]] + drafts)]
        return got, torch.stack(want)


def diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if torch.equal(a, b):
        return "equal"
    return f"{(a != b).sum().item()} differ, max {(a - b).abs().max().item():.3g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=512)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--streams", default="1,64", help="the deployments (their kernel plans), by streams")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = ModelConfig.from_dict(get_preset("qwen3.6-35b-a3b").config)
    model = build_random_model(config, "q4", "cuda")
    print(f"{torch.cuda.get_device_name()}, depth {args.depth}, k={args.k}")
    print("| deployment | B | decode: seq 0 vs alone | verify: seq 0's rows vs its decode steps |")
    print("|---|---|---|---|")
    for streams in (int(s) for s in args.streams.split(",")):
        fast.set_plan(model, resolve_plan("auto", "mma", streams))
        probe = Probe(model, args.depth, max(batches))
        alone = probe.decode(1)
        for b in batches:
            got, want = probe.verify(b, args.k)
            print(f"| {streams} streams | {b} | {diff(probe.decode(b), alone)} | {diff(got, want)} |", flush=True)
        del probe
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
