"""The MTP draft head's forward (model/mtp.py) against an independent fp64 implementation of spec 3.9, written here
from the spec's equations and read straight from the checkpoint files (not through our loader or modules).

transformers' Qwen3.5 classes have no MTP module (they list `mtp.*` under _keys_to_ignore_on_load_unexpected), so
the fp64 spec implementation is the outside oracle.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from deltaserve.model import ForwardBatch, ModelConfig
from deltaserve.synthetic import make_checkpoint
from deltaserve.weights import load_checkpoint

BLOCK = 16
LM = "model.language_model."


@pytest.fixture(scope="module", params=["tiny-moe", "tiny-dense"])
def ckpt(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=11, dtype="fp32",
                           progress=False)
    files = {}
    for f in sorted(path.glob("model*.safetensors")):
        files.update({k: v.double() for k, v in load_file(str(f)).items()})
    return load_checkpoint(path, progress=False, mtp=True), files


# ---- the spec's equations in fp64 ----------------------------------------------------------------------------------


def rms_zc(x, w, eps):
    """Zero-centred RMSNorm (spec 3.2): x / rms(x) * (1 + w)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rope(x, pos, cfg: ModelConfig):
    """Partial NeoX RoPE (spec 3.7) for text: the three MRoPE axes are equal, so 1-D. x [T, heads, D]."""
    rd = cfg.rotary_dim
    half = rd // 2
    inv = cfg.rope_theta ** (-torch.arange(0, half, dtype=torch.float64) * 2 / rd)
    ang = pos.double()[:, None] * inv[None, :]  # [T, half]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half], x[..., half:rd]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, x[..., rd:]], dim=-1)


def attention(u, pos, w, p, cfg: ModelConfig):
    """Gated full attention (spec 3.6) of rows u [T, H] at positions pos, causal over the rows themselves."""
    t, hq, hkv, d = u.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qg = (u @ w[f"{p}.q_proj.weight"].T).view(t, hq, 2 * d)
    q, gate = qg[..., :d], qg[..., d:].reshape(t, hq * d)
    k = (u @ w[f"{p}.k_proj.weight"].T).view(t, hkv, d)
    v = (u @ w[f"{p}.v_proj.weight"].T).view(t, hkv, d)
    eps = cfg.rms_norm_eps
    q, k = rope(rms_zc(q, w[f"{p}.q_norm.weight"], eps), pos, cfg), rope(rms_zc(k, w[f"{p}.k_norm.weight"], eps), pos, cfg)
    rep = hq // hkv
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # head h reads kv head h // rep
    scores = torch.einsum("thd,shd->hts", q, k) * d**-0.5
    scores = scores.masked_fill(pos[None, :, None] < pos[None, None, :], -math.inf)
    o = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(t, hq * d)
    return (o * torch.sigmoid(gate)) @ w[f"{p}.o_proj.weight"].T


def ffn(u, w, p, cfg: ModelConfig):
    """The MoE block (spec 3.8: softmax, top-k, always renormalised, sigmoid-gated shared expert) or dense MLP."""
    silu = torch.nn.functional.silu
    if not cfg.is_moe:
        return (silu(u @ w[f"{p}.gate_proj.weight"].T) * (u @ w[f"{p}.up_proj.weight"].T)) @ w[f"{p}.down_proj.weight"].T
    probs = (u @ w[f"{p}.gate.weight"].T).softmax(-1)
    top, ids = probs.topk(cfg.num_experts_per_tok, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    gate_up, down, inter = w[f"{p}.experts.gate_up_proj"], w[f"{p}.experts.down_proj"], cfg.moe_intermediate_size
    out = torch.zeros_like(u)
    for r in range(u.shape[0]):
        for wt, e in zip(top[r], ids[r].tolist()):
            h = gate_up[e] @ u[r]
            out[r] += wt * (down[e] @ (silu(h[:inter]) * h[inter:]))
    s = p + ".shared_expert"
    shared = (silu(u @ w[f"{s}.gate_proj.weight"].T) * (u @ w[f"{s}.up_proj.weight"].T)) @ w[f"{s}.down_proj.weight"].T
    return out + torch.sigmoid(u @ w[f"{p}.shared_expert_gate.weight"].T) * shared


def mtp_spec(w, cfg: ModelConfig, next_tokens, hidden, pos):
    """Spec 3.9 for rows (t_{i+1}, h_i, position i), causal over the rows: (y after mtp.norm, draft logits)."""
    eps = cfg.rms_norm_eps
    e = w[LM + "embed_tokens.weight"][next_tokens]
    x = torch.cat([rms_zc(e, w["mtp.pre_fc_norm_embedding.weight"], eps),
                   rms_zc(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)], dim=-1) @ w["mtp.fc.weight"].T
    p = "mtp.layers.0"
    x = x + attention(rms_zc(x, w[f"{p}.input_layernorm.weight"], eps), pos, w, f"{p}.self_attn", cfg)
    x = x + ffn(rms_zc(x, w[f"{p}.post_attention_layernorm.weight"], eps), w, f"{p}.mlp", cfg)
    y = rms_zc(x, w["mtp.norm.weight"], eps)
    head = w[LM + "embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return y, y @ head.T


# ---- the checks ----------------------------------------------------------------------------------------------------


def prompt(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rel(a, b) -> float:
    return ((a.double() - b).abs().max() / b.abs().max()).item()


@torch.no_grad()
def test_mtp_forward_matches_the_spec_in_fp64(ckpt):
    """Prefill P prompt tokens; the MTP's first pass over rows (t_{i+1}, h_i, i) for i < P fills its KV and drafts
    from the last row; then two more draft steps of one row each (hidden := the previous y, the drafted token,
    position + 1), reading the KV of every earlier row. All of it == spec 3.9 in fp64."""
    loaded, w = ckpt
    model, cfg = loaded.model, loaded.config
    assert model.mtp is not None and model.mtp.num_layers == 1
    n = 37
    ids = prompt(n, cfg.vocab_size, 3)
    table = list(range(4))
    cache = model.make_cache(4, BLOCK, 1, torch.float32, mtp=True)
    logits, h = model.forward_with_hidden(ForwardBatch.build([ids], [0], [table], [0], BLOCK, logits="all"), cache)
    assert torch.equal(logits, model.compute_logits(model.hidden_states(
        ForwardBatch.build([ids], [0], [table], [0], BLOCK, logits="all"), model.make_cache(4, BLOCK, 1, torch.float32)
    )))  # forward_with_hidden's logits are forward's
    nxt = ids[1:] + [int(logits[-1].argmax())]
    rows_tok, rows_h, rows_pos = list(nxt), [h], list(range(n))
    dl, y = model.draft(ForwardBatch.build([nxt], [0], [table], [0], BLOCK, logits="all"), cache, h)
    got_y, got_logits = [y], [dl]
    for step in (1, 2):  # two more drafts, one row each
        tok, pos = int(got_logits[-1][-1].argmax()), n + step - 1
        rows_tok.append(tok), rows_h.append(got_y[-1][-1:]), rows_pos.append(pos)
        dl, y = model.draft(ForwardBatch.build([[tok]], [pos], [table], [0], BLOCK), cache, got_y[-1][-1:], step=step)
        got_y.append(y), got_logits.append(dl)
    want_y, want_logits = mtp_spec(w, cfg, torch.tensor(rows_tok), torch.cat(rows_h).double(), torch.tensor(rows_pos))
    assert rel(torch.cat(got_y), want_y) < 2e-5
    assert rel(torch.cat(got_logits), want_logits) < 2e-5
    assert (torch.cat(got_logits).argmax(-1) == want_logits.argmax(-1)).all()


@torch.no_grad()
def test_mtp_rows_chunked_equal_whole_and_batched_equal_alone(ckpt):
    """The MTP's first pass over a prompt in two chunks (the second resuming from its KV) == in one; two sequences
    in one batch == each alone. To fp32 rounding, as the main model's reference path (CPU matmuls of different row
    counts may round differently; bits are the GPU fast path's contract)."""
    loaded, _ = ckpt
    model, cfg = loaded.model, loaded.config
    runs = {}
    for name, lengths in (("a", 29), ("b", 18)):
        ids = prompt(lengths, cfg.vocab_size, len(name) + lengths)
        cache = model.make_cache(8, BLOCK, 2, torch.float32, mtp=True)
        logits, h = model.forward_with_hidden(ForwardBatch.build([ids], [0], [[0, 1]], [0], BLOCK, logits="all"), cache)
        runs[name] = (ids[1:] + [int(logits[-1].argmax())], h)
    nxt, h = runs["a"]
    whole = model.draft(ForwardBatch.build([nxt], [0], [[0, 1]], [0], BLOCK, logits="all"),
                        model.make_cache(8, BLOCK, 2, torch.float32, mtp=True), h)
    cache = model.make_cache(8, BLOCK, 2, torch.float32, mtp=True)
    first = model.draft(ForwardBatch.build([nxt[:16]], [0], [[0, 1]], [0], BLOCK, logits="all"), cache, h[:16])
    second = model.draft(ForwardBatch.build([nxt[16:]], [16], [[0, 1]], [0], BLOCK, logits="all"), cache, h[16:])
    assert rel(torch.cat([first[1], second[1]]), whole[1].double()) < 1e-5
    assert rel(torch.cat([first[0], second[0]]), whole[0].double()) < 1e-5
    nb, hb = runs["b"]
    alone_b = model.draft(ForwardBatch.build([nb], [0], [[2, 3]], [1], BLOCK),
                          model.make_cache(8, BLOCK, 2, torch.float32, mtp=True), hb)
    both = model.draft(ForwardBatch.build([nxt, nb], [0, 0], [[0, 1], [2, 3]], [0, 1], BLOCK),
                       model.make_cache(8, BLOCK, 2, torch.float32, mtp=True), torch.cat([h, hb]))
    assert rel(both[0][0], whole[0][-1].double()) < 1e-5 and rel(both[0][1], alone_b[0][0].double()) < 1e-5


def test_draft_needs_the_head_and_its_cache(ckpt, tmp_path):
    loaded, _ = ckpt
    model = loaded.model
    batch = ForwardBatch.build([[3]], [0], [[0]], [0], BLOCK)
    hidden = torch.zeros(1, loaded.config.hidden_size)
    with pytest.raises(ValueError, match="make_cache\\(mtp=True\\)"):
        model.draft(batch, model.make_cache(1, BLOCK, 1, torch.float32), hidden)
    bare = load_checkpoint(loaded.path, progress=False, mtp=False).model
    with pytest.raises(RuntimeError, match="speculative decoding with the model's own draft head is unavailable"):
        bare.draft(batch, bare.make_cache(1, BLOCK, 1, torch.float32), hidden)
    with pytest.raises(ValueError, match="loaded without an MTP head"):
        bare.make_cache(1, BLOCK, 1, torch.float32, mtp=True)
