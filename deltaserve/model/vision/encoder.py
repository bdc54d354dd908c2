"""The Qwen3.5 / 3.6 vision tower (Qwen3-VL's encoder without deepstack; spec 2.4, 3.10).

forward(pixel_values [N, C*T*P*P], grids [(t, h, w), ...]) -> features [N / m^2, out_hidden] (m = merge size):
  1. patch embedding: the Conv3d with kernel = stride = (T, P, P) is a linear map of each flattened patch row
     (weight [D, C*T*P*P] in (C, T, P, P) order, with bias);
  2. + the learned side x side position table, bilinearly resampled to each image's grid (grid.position_taps);
  3. `depth` pre-norm blocks (LayerNorm eps 1e-6): x += proj(attn(norm1 x)); x += fc2(gelu_tanh(fc1(norm2 x))),
     attention bidirectional within each temporal group of each image, q/k rotated by a 2-D rotary embedding
     (angles [row * inv_freq | col * inv_freq], duplicated over the head: rotate_half over all head_dim dims, fp32);
  4. merger: LayerNorm on every patch, each window of m x m consecutive rows concatenated (m^2 * D), fc1, exact
     GELU, fc2 -> out_hidden (the text hidden size).
Parameter names are the published ones without `model.visual.` (`patch_embed.proj.weight` is stored here as the
2-D [D, C*T*P*P] matrix; the loader reshapes the 5-D Conv3d weight).

Linear weights come from `linear_factory(name, in, out)` (dense here; a quantised checkpoint format may give packed
modules with the same call), each with its own fp32-or-activation `bias` parameter added after the matmul.
Attention runs per image with torch's SDPA (the CPU reference and the CUDA path alike): each image's rows attend
only among themselves, so an image's features never depend on the other images of the call.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from . import grid as G

LN_EPS = 1e-6


class VisionLinear(nn.Module):
    """Dense linear with bias: weight [out, in], bias [out]."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))


def dense_linear(name: str, in_features: int, out_features: int) -> nn.Module:
    return VisionLinear(in_features, out_features)


class Biased(nn.Module):
    """A packed linear module (bias-free call, e.g. quant.AffineLinear) plus the vision layer's bias. Its parameters
    are adopted under this module's own names (`weight`, `scales`, ... beside `bias`), so the published tensor names
    map one to one."""

    def __init__(self, inner: nn.Module, out_features: int):
        super().__init__()
        self._inner = (inner,)  # a tuple: not registered (its parameters are registered on self)
        self._leaves = [leaf for leaf, _ in inner.named_parameters(recurse=False)]
        for leaf in self._leaves:
            self.register_parameter(leaf, getattr(inner, leaf))
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self._inner[0]
        for leaf in self._leaves:  # the loader installs parameters on self: point the packed module at them
            inner._parameters[leaf] = self._parameters[leaf]
        return inner(x) + self.bias.to(x.dtype)


def with_bias(module: nn.Module, out_features: int) -> nn.Module:
    """The factory's module as a linear with bias: a dense VisionLinear as it is, a packed one wrapped."""
    return module if isinstance(module, VisionLinear) else Biased(module, out_features)


class LayerNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.bias.to(x.dtype), LN_EPS)


class VisionAttention(nn.Module):
    def __init__(self, p: str, cfg: VisionConfig, linear: Callable):
        super().__init__()
        D = cfg.hidden_size
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = with_bias(linear(f"{p}.qkv", D, 3 * D), 3 * D)
        self.proj = with_bias(linear(f"{p}.proj", D, D), D)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)  # [N, heads, hd] each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = torch.empty_like(q)
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # one image (temporal group) at a time: its own window
            qi, ki, vi = (t[lo:hi].transpose(0, 1) for t in (q, k, v))  # [heads, n_i, hd]
            out[lo:hi] = F.scaled_dot_product_attention(qi, ki, vi).transpose(0, 1)
        return self.proj(out.reshape(n, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate_half rotary over the whole head in fp32, cast back; x [N, heads, hd], cos/sin [N, hd]."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rot * sin[:, None]).to(x.dtype)


class VisionMLP(nn.Module):
    def __init__(self, p: str, cfg: VisionConfig, linear: Callable):
        super().__init__()
        D, inter = cfg.hidden_size, cfg.intermediate_size
        self.linear_fc1 = with_bias(linear(f"{p}.linear_fc1", D, inter), inter)
        self.linear_fc2 = with_bias(linear(f"{p}.linear_fc2", inter, D), D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    def __init__(self, i: int, cfg: VisionConfig, linear: Callable):
        super().__init__()
        p = f"blocks.{i}"
        self.norm1, self.norm2 = LayerNorm(cfg.hidden_size), LayerNorm(cfg.hidden_size)
        self.attn = VisionAttention(f"{p}.attn", cfg, linear)
        self.mlp = VisionMLP(f"{p}.mlp", cfg, linear)

    def forward(self, x, cos, sin, bounds):
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, cfg: VisionConfig, linear: Callable):
        super().__init__()
        merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.merged = merged
        self.norm = LayerNorm(cfg.hidden_size)
        self.linear_fc1 = with_bias(linear("merger.linear_fc1", merged, merged), merged)
        self.linear_fc2 = with_bias(linear("merger.linear_fc2", merged, cfg.out_hidden_size), cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).view(-1, self.merged)  # m^2 consecutive rows = one window
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig, linear: Callable):
        super().__init__()
        self.proj = with_bias(linear("patch_embed.proj", cfg.patch_dim, cfg.hidden_size), cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class PositionTable(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_position_embeddings, cfg.hidden_size), requires_grad=False)


class VisionTower(nn.Module):
    def __init__(self, config: VisionConfig, linear_factory: Callable | None = None):
        super().__init__()
        linear = linear_factory or dense_linear
        self.config = config
        self.patch_embed = PatchEmbed(config, linear)
        self.pos_embed = PositionTable(config)
        self.blocks = nn.ModuleList(VisionBlock(i, config, linear) for i in range(config.depth))
        self.merger = PatchMerger(config, linear)

    @property
    def dtype(self) -> torch.dtype:
        return self.pos_embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.pos_embed.weight.device

    def rotary(self, grids: Sequence[G.Grid], device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] fp32 of the 2-D rotary embedding."""
        cfg = self.config
        quarter = cfg.head_dim // 2  # angles per axis: row freqs then col freqs, then the whole repeated
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, quarter, 2, dtype=torch.float32) / quarter))
        coords = G.rotary_coords(grids, cfg.spatial_merge_size).to(torch.float32)  # [N, 2]
        ang = (coords[:, :, None] * inv_freq).reshape(coords.shape[0], -1)  # [N, head_dim/2]: rows | cols
        ang = torch.cat([ang, ang], dim=-1).to(device)
        return ang.cos(), ang.sin()

    def position_embeddings(self, grids: Sequence[G.Grid]) -> torch.Tensor:
        """[N, D] resampled learned positions (fp32 weights times the table, summed over the 4 taps)."""
        idx, wts = G.position_taps(grids, self.config.grid_side, self.config.spatial_merge_size)
        table = self.pos_embed.weight
        rows = table[idx.to(table.device)].float()  # [N, 4, D]
        return (rows * wts.to(table.device)[..., None]).sum(1)

    def forward(self, pixel_values: torch.Tensor, grids: Sequence[G.Grid]) -> torch.Tensor:
        grids = [tuple(int(v) for v in g) for g in grids]
        expected = sum(t * h * w for t, h, w in grids)
        if pixel_values.dim() != 2 or pixel_values.shape != (expected, self.config.patch_dim):
            raise ValueError(f"vision tower: pixel_values {tuple(pixel_values.shape)} do not match the grids {grids} "
                             f"(expected [{expected}, {self.config.patch_dim}])")
        x = self.patch_embed(pixel_values.to(self.device, self.dtype))
        x = x + self.position_embeddings(grids).to(x.dtype)
        cos, sin = self.rotary(grids, x.device)
        bounds = G.attention_bounds(grids)
        for block in self.blocks:
            x = block(x, cos, sin, bounds)
        return self.merger(x)
