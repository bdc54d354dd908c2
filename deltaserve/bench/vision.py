"""`deltaserve bench vision`: time to first token of a chat turn with images, split into image pre-processing,
vision encoder and language-model prefill, and the encoder's images/s at a batch of images; random weights at a
preset's shapes (default Qwen3.6-35B-A3B: 27-block 1152-wide tower, q4 text model), generated on the device.

  deltaserve bench vision --preset qwen3.6-35b-a3b --quant q4 --images 1,4 --vit-batch 8 -r 5

A 1024x1024 image is 64x64 patches of 16 -> 1,024 image tokens (merge 2x2). TTFT runs the engine: add_request (the
image decoded, resized and patchified on the host) and steps until the first token; the encoder time is the
request's own encoder call (synchronised), prefill = TTFT - pre-processing - encoder. Records: JSON lines under
bench/results/ like `deltaserve bench`'s, with the split in milliseconds.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import time

import torch
from torch import nn

from ..engine.engine import EngineConfig, LLMEngine
from ..engine.multimodal import ImageSupport
from ..engine.sampling_params import SamplingParams
from ..model import ModelConfig
from ..model.vision import VisionTower
from . import records
from .random_model import build_random_model


def parse_args(argv):
    p = argparse.ArgumentParser(prog="deltaserve bench vision", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3.6-35b-a3b", help="synthetic preset whose shapes to build")
    p.add_argument("--quant", default="q4", choices=["q4", "q8", "bf16"], help="text model weight format")
    p.add_argument("--images", default="1,4", help="images per chat turn (comma list)")
    p.add_argument("--size", type=int, default=1024, help="image side in pixels (default 1024: 1,024 tokens)")
    p.add_argument("--vit-batch", type=int, default=8, help="images per encoder call for images/s (0: skip)")
    p.add_argument("--text-tokens", type=int, default=32, help="text tokens of the user turn besides the images")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="prefill chunk (default: whole prompt)")
    p.add_argument("-r", "--reps", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--results", default="bench/results")
    p.add_argument("--no-record", action="store_true")
    return p.parse_args(argv)


def random_tower(config: ModelConfig, device, dtype=torch.bfloat16, seed: int = 0) -> VisionTower:
    """The preset's vision tower with random weights (linears ~ N(0, 1/fan_in), LayerNorms ~1, small biases)."""
    with torch.device("meta"):
        tower = VisionTower(config.vision())
    gen = torch.Generator(device=device).manual_seed(seed)
    for mod_name, module in tower.named_modules():
        for name, meta in list(module.named_parameters(recurse=False)):
            full = f"{mod_name}.{name}"
            if "norm" in mod_name and name == "weight":
                value = 1 + 0.05 * torch.randn(meta.shape, device=device, generator=gen)
            elif name == "bias":
                value = 0.02 * torch.randn(meta.shape, device=device, generator=gen)
            else:
                fan_in = 1 if full == "pos_embed.weight" else meta.shape[-1]
                value = torch.randn(meta.shape, device=device, generator=gen) / math.sqrt(fan_in)
            setattr(module, name, nn.Parameter(value.to(dtype), requires_grad=False))
    return tower.eval()


def png(size: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class TimedEncoder:
    """ImageSupport.encode with the time of each call (synchronised before and after)."""

    def __init__(self, support: ImageSupport, device):
        self.inner, self.device, self.seconds = support.encode, device, []
        support.encode = self

    def __call__(self, pixel_values, grids):
        _sync(self.device)
        t = time.perf_counter()
        out = self.inner(pixel_values, grids)
        _sync(self.device)
        self.seconds.append(time.perf_counter() - t)
        return out


def chat_turn(ids: dict[str, int], bpe_size: int, n_images: int, text_tokens: int) -> list[int]:
    """The token shape of a chat turn: <|im_start|> role \\n (<|vision_start|><|image_pad|><|vision_end|>) x n, text,
    <|im_end|> \\n <|im_start|> role \\n (ordinary ids stand for the words: the weights are random anyway)."""
    image = [ids["<|vision_start|>"], ids["<|image_pad|>"], ids["<|vision_end|>"]]
    word = [(37 + 7 * i) % (bpe_size - 1) + 1 for i in range(text_tokens + 4)]
    return ([ids["<|im_start|>"], word[0], word[1]] + image * n_images + word[4:] + [ids["<|im_end|>"], word[1],
            ids["<|im_start|>"], word[2], word[3]])


def main(argv=None) -> int:
    from ..synthetic.presets import get_preset

    args = parse_args(sys.argv[1:] if argv is None else argv)
    dev = torch.device(args.device)
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    preset = get_preset(args.preset)
    config = ModelConfig.from_dict(preset.config)
    t0 = time.perf_counter()
    model = build_random_model(config, args.quant, dev)
    tower = random_tower(config, dev)
    support = ImageSupport.for_model(tower, config)
    timer = TimedEncoder(support, dev)
    quant = {"q4": "q4g64", "q8": "q8g64"}.get(args.quant, args.quant)
    print(f"# {args.preset} {quant} + bf16 vision tower on {gpu}, built in {time.perf_counter() - t0:.1f}s", flush=True)
    image = png(args.size, 0)
    tokens_per_image = support.process([image])[0].num_tokens
    n_images = [int(v) for v in args.images.split(",") if v.strip()]
    longest = max(n_images) * (tokens_per_image + 2) + args.text_tokens + 16
    engine = LLMEngine(model, None, config.eos_token_ids, EngineConfig(
        max_num_seqs=1, max_num_batched_tokens=max(args.max_num_batched_tokens, 16), max_model_len=longest + 64,
        cuda_graphs=False, num_blocks=-(-(longest + 64) // 16) + 1), support)
    recs = []

    def keep(rec):
        recs.append(rec)
        print(rec, flush=True)
        if not args.no_record:
            records.append_records([rec], args.results, gpu)

    for n in n_images:
        ids = chat_turn(preset.special_ids, preset.bpe_size, n, args.text_tokens)
        images = [png(args.size, i) for i in range(n)]
        rows = []
        for rep in range(args.reps + 1):  # the first run warms up (kernel compiles, allocations)
            timer.seconds.clear()
            _sync(dev)
            t = time.perf_counter()
            pre = time.perf_counter()
            engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0), images=images)
            pre = time.perf_counter() - pre
            while engine.has_unfinished():
                engine.step()
            _sync(dev)
            ttft = time.perf_counter() - t
            if rep:
                rows.append((ttft, pre, sum(timer.seconds)))
        ttft, pre, enc = (statistics.median(c) for c in zip(*rows))
        prompt = len(ids) - n + n * tokens_per_image
        rec = records.make_record("deltaserve", gpu, args.preset, quant, "ttft-img", n * tokens_per_image, 0, n,
                                  prompt / ttft, statistics.stdev([prompt / r[0] for r in rows]) if len(rows) > 1
                                  else 0.0, args.reps, notes=f"chat turn, {n} image(s) of {args.size}x{args.size} "
                                  f"({tokens_per_image} tokens each), {prompt} prompt tokens; tok_s = prompt / TTFT; "
                                  f"chunk {args.max_num_batched_tokens}; random weights")
        rec.update(ttft_ms=round(ttft * 1e3, 2), preprocess_ms=round(pre * 1e3, 2), encoder_ms=round(enc * 1e3, 2),
                   prefill_ms=round((ttft - pre - enc) * 1e3, 2))
        keep(rec)

    if args.vit_batch:
        processed = support.process([png(args.size, i) for i in range(args.vit_batch)])
        pix, grids = [p.pixel_values for p in processed], [p.grid for p in processed]
        times = []
        for rep in range(args.reps + 1):
            timer.seconds.clear()
            timer(pix, grids)
            if rep:
                times.append(timer.seconds[0])
        rates = [args.vit_batch / s for s in times]
        rec = records.make_record("deltaserve", gpu, args.preset, "bf16", "vit-images", tokens_per_image, 0,
                                  args.vit_batch, statistics.median(rates) * tokens_per_image,
                                  statistics.stdev(rates) * tokens_per_image if len(rates) > 1 else 0.0, args.reps,
                                  notes=f"vision encoder alone, {args.vit_batch} images of {args.size}x{args.size} per "
                                  "call (per-image attention); tok_s = output tokens/s; random weights")
        rec.update(images_s=round(statistics.median(rates), 2), encoder_ms=round(statistics.median(times) * 1e3, 2))
        keep(rec)
    if not args.no_record:
        print(f"# {len(recs)} records appended under {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
