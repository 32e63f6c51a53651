"""fp32 torch reference of the MTP module mtp.0 (spec/model.md §5.6), used by make_goldens.py.

transformers 5.17 does not build MTP, and its decoder layer takes the layer kind, RoPE and
cache from the main model's config, so the block math is written out here from the spec
formulas (§4 RMSNorm, §5.2 mHC, §5.3 SWA attention with sink, §5.4 non-hash MoE, §5.5 head)
rather than borrowing HF's layer. Weights: the case checkpoint's mtp.0.* tensors,
dequantised with make_goldens.py's own functions.
"""
import torch


def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope(x, pos, inv_freq, inverse=False):
    """Interleaved pairs on the last 2*len(inv_freq) channels; angle in fp32 like the engine."""
    r = 2 * inv_freq.numel()
    ang = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # [S, r/2]
    shape = [ang.shape[0]] + [1] * (x.dim() - 2) + [ang.shape[1]]
    c, s = torch.cos(ang).view(shape), torch.sin(ang).view(shape)
    if inverse:
        s = -s
    head, tail = x[..., :-r], x[..., -r:]
    a, b = tail[..., 0::2], tail[..., 1::2]
    out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([head, out], dim=-1)


def hc_pre(X, fn, base, scale, n, iters, eps, norm_eps):
    """X [S, n, d] -> (u [S, d], post [S, n], P [S, n, n])."""
    v = X.flatten(1)
    mu = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + norm_eps) * (v @ fn.T)
    pre = torch.sigmoid(scale[0] * mu[:, :n] + base[:n]) + eps
    post = 2 * torch.sigmoid(scale[1] * mu[:, n:2 * n] + base[n:2 * n])
    M = (scale[2] * mu[:, 2 * n:] + base[2 * n:]).view(-1, n, n)
    P = torch.softmax(M, dim=-1) + eps
    P = P / (P.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        P = P / (P.sum(-1, keepdim=True) + eps)
        P = P / (P.sum(-2, keepdim=True) + eps)
    u = (pre[:, :, None] * X).sum(1)
    return u, post, P


def hc_post(X, F, post, P):
    # X'[k] = post_k F + sum_j P[j, k] X[j]
    return post[:, :, None] * F[:, None, :] + torch.einsum("sjk,sjd->skd", P, X)


def attention(u, W, cfg, pos, inv_freq):
    S = u.shape[0]
    H, D, win, G, Ro = cfg["num_attention_heads"], cfg["head_dim"], cfg["sliding_window"], cfg["o_groups"], cfg["o_lora_rank"]
    eps = cfg["rms_norm_eps"]
    qr = rms(u @ W["attn.wq_a.weight"].T, W["attn.q_norm.weight"], eps)
    q = rms((qr @ W["attn.wq_b.weight"].T).view(S, H, D), None, eps)
    q = rope(q, pos, inv_freq)
    kv = rope(rms(u @ W["attn.wkv.weight"].T, W["attn.kv_norm.weight"], eps), pos, inv_freq)
    logits = torch.einsum("shd,td->sht", q, kv) / D ** 0.5
    t = torch.arange(S)
    visible = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - win)
    logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
    sink = W["attn.attn_sink"].view(1, H, 1).expand(S, H, 1)
    p = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    o = rope(torch.einsum("sht,td->shd", p, kv), pos, inv_freq, inverse=True)
    og = o.reshape(S, G, H * D // G)
    wo_a = W["attn.wo_a.weight"].view(G, Ro, H * D // G)
    y = torch.einsum("sgi,gri->sgr", og, wo_a).reshape(S, G * Ro)
    return y @ W["attn.wo_b.weight"].T


def swiglu(x, w1, w3, w2, limit):
    g, v = x @ w1.T, x @ w3.T
    if limit > 0:
        g, v = g.clamp(max=limit), v.clamp(-limit, limit)
    return (torch.nn.functional.silu(g) * v) @ w2.T


def moe(u, W, cfg):
    E, K, limit = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg.get("swiglu_limit", 0.0)
    score = torch.sqrt(torch.nn.functional.softplus(u @ W["ffn.gate.weight"].T))
    pick = torch.topk(score + W["ffn.gate.bias"], K, dim=-1).indices
    wts = score.gather(1, pick)
    wts = wts / wts.sum(-1, keepdim=True) * cfg["routed_scaling_factor"]
    s = "ffn.shared_experts."
    out = swiglu(u, W[s + "w1.weight"], W[s + "w3.weight"], W[s + "w2.weight"], limit)
    for e in range(E):
        rows, slot = (pick == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        p = f"ffn.experts.{e}."
        y = swiglu(u[rows], W[p + "w1.weight"], W[p + "w3.weight"], W[p + "w2.weight"], limit)
        out = out.index_add(0, rows, wts[rows, slot][:, None] * y)
    return out


def mtp_logits(X, next_ids, W, embed, head, cfg):
    """X [S, n, d]: main-model streams of positions 0..S-1 (after the last block, before
    hc_head); next_ids [S]: token t+1 of each. Returns logits [S, V] for tokens t+2."""
    n, eps, iters = cfg["hc_mult"], cfg["rms_norm_eps"], cfg.get("hc_sinkhorn_iters", 20)
    hc_eps = cfg.get("hc_eps", 1e-6)
    r = cfg["qk_rope_head_dim"]
    expo = torch.arange(0, r, 2, dtype=torch.float32) / r
    inv_freq = (1.0 / torch.pow(torch.tensor(float(cfg["rope_theta"]), dtype=torch.float64), expo.double())).float()
    S = X.shape[0]
    pos = torch.arange(S)
    e_hat = rms(embed[next_ids], W["enorm.weight"], eps)
    Z = rms(X, W["hnorm.weight"], eps) @ W["h_proj.weight"].T + (e_hat @ W["e_proj.weight"].T)[:, None, :]
    u, post, P = hc_pre(Z, W["hc_attn_fn"], W["hc_attn_base"], W["hc_attn_scale"], n, iters, hc_eps, eps)
    Z = hc_post(Z, attention(rms(u, W["attn_norm.weight"], eps), W, cfg, pos, inv_freq), post, P)
    u, post, P = hc_pre(Z, W["hc_ffn_fn"], W["hc_ffn_base"], W["hc_ffn_scale"], n, iters, hc_eps, eps)
    Z = hc_post(Z, moe(rms(u, W["ffn_norm.weight"], eps), W, cfg), post, P)
    v = Z.flatten(1)
    mu = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * (v @ W["hc_head_fn"].T)
    pre = torch.sigmoid(W["hc_head_scale"][0] * mu + W["hc_head_base"]) + hc_eps
    h = rms((pre[:, :, None] * Z).sum(1), W["norm.weight"], eps)
    return h @ head.T
