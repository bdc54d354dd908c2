"""Gated DeltaNet, reference path: gates, the recurrent (token by token) and chunked (C = 64) forms.

Shapes for one sequence (no batch axis; the model loops over sequences on the reference path):
  q, k  [T, Hk, dk]  already L2-normalised (q NOT yet scaled; `scale` is applied here)
  v     [T, Hv, dv]
  g     [T, Hv]      log decay (<= 0), fp32
  beta  [T, Hv]      fp32
  state [Hv, dk, dv] fp32, S with read-out o = S^T q
Value head h reads key/query head h // (Hv / Hk) ("grouped", repeat_interleave).
All arithmetic in fp32 (or fp64 when given fp64 inputs, for tests); outputs o [T, Hv, dv] in the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """g = -exp(A_log) * softplus(a + dt_bias) (log decay), beta = sigmoid(b); both fp32, [T, Hv]."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def _expand_heads(q: torch.Tensor, k: torch.Tensor, hv: int) -> tuple[torch.Tensor, torch.Tensor]:
    r = hv // q.shape[1]
    if r > 1:
        q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
    return q, k


def _prepare(q, k, v, g, beta, state):
    """Shared prologue of both forms: fp64 if any input is fp64 (tests) else fp32, q/k expanded to the Hv value
    heads, and the initial state (zeros for a fresh sequence; a copy, never the caller's tensor)."""
    hv, dv, dk = v.shape[1], v.shape[2], q.shape[-1]
    given = [q, k, v, g, beta] + ([state] if state is not None else [])
    dt = torch.float64 if any(x.dtype == torch.float64 for x in given) else torch.float32
    q, k = _expand_heads(q, k, hv)
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    s = torch.zeros(hv, dk, dv, dtype=dt, device=v.device) if state is None else state.to(dt).clone()
    return q, k, v, g, beta, s


def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step form: S <- a_t S; u = beta_t (v_t - S^T k_t); S <- S + k_t u^T; o_t = S^T (scale q_t)."""
    t_len, hv, dv = v.shape
    q, k, v, g, beta, s = _prepare(q, k, v, g, beta, state)
    out = torch.empty(t_len, hv, dv, dtype=s.dtype, device=v.device)
    for t in range(t_len):
        s = s * g[t].exp()[:, None, None]
        mem = torch.einsum("hkv,hk->hv", s, k[t])
        u = beta[t][:, None] * (v[t] - mem)
        s = s + k[t][:, :, None] * u[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", s, q[t] * scale)
    return out, s


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (WY) form, exactly equivalent to `gated_delta_recurrent` (up to rounding).

    Per chunk of C tokens with gamma = cumsum(g) and D_ij = exp(gamma_i - gamma_j) (i >= j):
      A = strict_lower((beta k) k^T * D);  T = (I + A)^-1  (forward substitution)
      U = T (beta v);  W = T (beta k * exp(gamma))
      v_new = U - W S;  o = (scale q * exp(gamma)) S + lower_incl((scale q) k^T * D) v_new
      S <- exp(gamma_last) S + (k * exp(gamma_last - gamma))^T v_new
    The tail is padded with g = 0, beta = 0, k = q = v = 0, which leaves the state untouched.
    """
    t_len, hv, dv = v.shape
    q, k, v, g, beta, s = _prepare(q, k, v, g, beta, state)
    dt = s.dtype
    # [Hv, T, ...] head-major
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    g, beta = (x.transpose(0, 1) for x in (g, beta))
    c = chunk_size
    pad = (-t_len) % c
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n_chunks = (t_len + pad) // c
    q = q * scale
    out = torch.empty(hv, n_chunks * c, dv, dtype=dt, device=v.device)
    lower_incl = torch.tril(torch.ones(c, c, dtype=torch.bool, device=v.device))
    strict = torch.tril(torch.ones(c, c, dtype=torch.bool, device=v.device), diagonal=-1)
    eye = torch.eye(c, dtype=dt, device=v.device)
    for i in range(n_chunks):
        sl = slice(i * c, (i + 1) * c)
        qc, kc, vc, gc, bc = q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl]
        gamma = gc.cumsum(-1)  # [Hv, C]
        diff = gamma[:, :, None] - gamma[:, None, :]
        decay = torch.where(lower_incl, diff, torch.full_like(diff, float("-inf"))).exp()  # D, zero above diag
        kb = kc * bc[..., None]
        a_mat = (kb @ kc.transpose(-1, -2) * decay).masked_fill(~strict, 0.0)
        # T = (I + A)^-1 by forward substitution (A strictly lower)
        t_mat = torch.linalg.solve_triangular(eye + a_mat, eye.expand_as(a_mat), upper=False, unitriangular=True)
        u = t_mat @ (vc * bc[..., None])
        w = t_mat @ (kb * gamma.exp()[..., None])
        v_new = u - w @ s
        attn = (qc @ kc.transpose(-1, -2) * decay).masked_fill(~lower_incl, 0.0)
        out[:, sl] = (qc * gamma.exp()[..., None]) @ s + attn @ v_new
        last = gamma[:, -1:]  # [Hv, 1]
        s = s * last.exp()[..., None] + (kc * (last - gamma).exp()[..., None]).transpose(-1, -2) @ v_new
    return out[:, :t_len].transpose(0, 1), s
