"""A prompt with images: placeholder expansion and its 3-D (T, H, W) RoPE positions (spec 3.11).

The chat template writes one `<|image_pad|>` per image (inside `<|vision_start|> ... <|vision_end|>`); the prompt the
model sees repeats it once per image token (grid t*h*w / merge^2). Positions: text tokens get (p, p, p) with p
counting up; the tokens of an image whose llm grid is (t, h', w') = (t, h/m, w/m) get (s + ti, s + hi, s + wi) where
s is the next free position, and the text after it resumes at s + max(h', w') (images have t = 1). rope_delta
= (largest position + 1) - prompt length: a token at cache index i >= prompt length has position i + rope_delta on
all three axes.
"""

from __future__ import annotations

from typing import Sequence

import torch

Grid = tuple[int, int, int]


def expand_placeholders(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """(expanded ids, [start, end) of each image's tokens): the i-th `image_token_id` becomes counts[i] copies.

    The prompt must hold exactly one placeholder per image."""
    found = sum(1 for t in ids if t == image_token_id)
    if found != len(counts):
        raise ValueError(f"the prompt has {found} image placeholder token(s) (id {image_token_id}, <|image_pad|>) "
                         f"for {len(counts)} image(s): write one placeholder per image (the chat template does)")
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    k = 0
    for t in ids:
        if t == image_token_id:
            spans.append((len(out), len(out) + counts[k]))
            out.extend([image_token_id] * counts[k])
            k += 1
        else:
            out.append(int(t))
    return out, spans


def mrope_positions(length: int, spans: Sequence[tuple[int, int]], grids: Sequence[Grid], merge: int
                    ) -> tuple[torch.Tensor, int]:
    """positions [3, length] int64 of a prompt whose image i occupies spans[i] with patch grid grids[i], and its
    rope_delta."""
    pos = torch.empty(3, length, dtype=torch.int64)
    cursor = 0  # next prompt index to place
    nxt = 0  # next free position
    for (lo, hi), (t, h, w) in zip(spans, grids):
        n_text = lo - cursor
        pos[:, cursor:lo] = torch.arange(nxt, nxt + n_text)
        nxt += n_text
        gh, gw = h // merge, w // merge
        if hi - lo != t * gh * gw:
            raise ValueError(f"image span [{lo}, {hi}) holds {hi - lo} tokens, its grid {(t, h, w)} needs {t * gh * gw}")
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        pos[:, lo:hi] = torch.stack([tt, hh, ww]).reshape(3, -1) + nxt
        nxt += max(gh, gw)
        cursor = hi
    pos[:, cursor:] = torch.arange(nxt, nxt + length - cursor)
    nxt += length - cursor
    return pos, nxt - length
