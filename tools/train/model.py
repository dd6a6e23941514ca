"""The Strata model family in PyTorch, written from shared/SPEC.md (its own code: nothing here is
taken from the C engine). KDA with the lower-bounded gate (chunked form, checked against the
per-token recurrence by `python3 model.py --self-test`), gated MLA without positional encoding,
Block Attention Residuals, latent MoE with SiTU-GLU, shared experts, sigmoid top-k routing with
the score-correction bias (updated aux-free, DeepSeek-V3 style). fp32 throughout.

Runs on PyTorch 1.13 (Debian 12) and 2.x: torch>=2-only calls are guarded.
Config keys are those of config.json's text_config (SPEC §1); `Config.to_text_config()` writes them.
"""
import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

MLA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm (checkpoint-layout §5.4)
L2_EPS = 1e-6
KDA_TILE = 16  # tokens per chunk: with g >= -5, exp(-G) over a tile stays below e^80 (SPEC §3.3)


class Config:
    """The text_config of a Strata/K3 checkpoint, as plain attributes."""

    def __init__(self, **kw):
        self.hidden_size = kw["hidden_size"]
        self.num_hidden_layers = kw["num_hidden_layers"]
        self.vocab_size = kw["vocab_size"]
        self.rms_norm_eps = kw.get("rms_norm_eps", 1e-5)
        self.tie_word_embeddings = kw.get("tie_word_embeddings", False)
        lac = kw["linear_attn_config"]
        self.kda_heads = lac["num_heads"]
        self.kda_head_dim = lac["head_dim"]
        self.conv_k = lac.get("short_conv_kernel_size", 4)
        self.gate_lower_bound = lac.get("gate_lower_bound", -5.0)
        assert self.gate_lower_bound is not None and self.gate_lower_bound < 0, "only the lower-bounded gate"
        assert lac.get("use_full_rank_gate", True), "only the full-rank output gate"
        self.full_attn_layers = list(lac["full_attn_layers"])  # 1-based
        self.f_rank = kw.get("f_rank", self.kda_head_dim)  # not a config key: from shapes in the C loader
        self.num_attention_heads = kw["num_attention_heads"]
        self.q_lora_rank = kw.get("q_lora_rank") or 0
        self.kv_lora_rank = kw["kv_lora_rank"]
        self.qk_nope_head_dim = kw["qk_nope_head_dim"]
        self.qk_rope_head_dim = kw.get("qk_rope_head_dim", 0)
        self.v_head_dim = kw["v_head_dim"]
        self.mla_use_output_gate = kw.get("mla_use_output_gate", True)
        self.attn_res_block_size = kw.get("attn_res_block_size", 0) or 0
        self.first_k_dense_replace = kw.get("first_k_dense_replace", 1)
        self.intermediate_size = kw["intermediate_size"]
        self.num_experts = kw["num_experts"]
        self.num_experts_per_token = kw["num_experts_per_token"]
        self.num_shared_experts = kw.get("num_shared_experts", 0)
        self.moe_intermediate_size = kw["moe_intermediate_size"]
        self.routed_expert_hidden_size = kw["routed_expert_hidden_size"]
        self.latent_moe_use_norm = kw.get("latent_moe_use_norm", True)
        self.moe_renormalize = kw.get("moe_renormalize", True)
        self.routed_scaling_factor = kw.get("routed_scaling_factor", 1.0)
        assert kw.get("hidden_act", "situ") == "situ", "only SiTU-GLU"
        self.situ_beta = kw.get("activation_situ_beta", 4.0)
        self.situ_linear_beta = kw.get("activation_situ_linear_beta", 25.0)
        self.bos_token_id = kw.get("bos_token_id")
        self.eos_token_id = kw.get("eos_token_id")
        self.mxfp4_experts = kw.get("mxfp4_experts", True)

    def is_mla(self, l):
        return (l + 1) in self.full_attn_layers

    def is_moe(self, l):
        return self.num_experts > 0 and l >= self.first_k_dense_replace

    def to_text_config(self):
        n = self.num_hidden_layers
        return {
            "architectures": ["KimiLinearForCausalLM"],
            "model_type": "kimi_linear",
            "dtype": "bfloat16",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": n,
            "vocab_size": self.vocab_size,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "situ",
            "activation_situ_beta": self.situ_beta,
            "activation_situ_linear_beta": self.situ_linear_beta,
            "attn_res_block_size": self.attn_res_block_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank if self.q_lora_rank else None,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "mla_use_nope": True,
            "mla_use_output_gate": self.mla_use_output_gate,
            "first_k_dense_replace": self.first_k_dense_replace,
            "moe_layer_freq": 1,
            "num_experts": self.num_experts,
            "num_experts_per_token": self.num_experts_per_token,
            "num_shared_experts": self.num_shared_experts,
            "moe_intermediate_size": self.moe_intermediate_size,
            "routed_expert_hidden_size": self.routed_expert_hidden_size,
            "latent_moe_use_norm": self.latent_moe_use_norm,
            "moe_router_activation_func": "sigmoid",
            "topk_method": "noaux_tc",
            "use_grouped_topk": True,
            "num_expert_group": 1,
            "topk_group": 1,
            "moe_renormalize": self.moe_renormalize,
            "routed_scaling_factor": self.routed_scaling_factor,
            "num_nextn_predict_layers": 0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "linear_attn_config": {
                "num_heads": self.kda_heads,
                "head_dim": self.kda_head_dim,
                "short_conv_kernel_size": self.conv_k,
                "gate_lower_bound": self.gate_lower_bound,
                "use_full_rank_gate": True,
                "full_attn_layers": self.full_attn_layers,
                "kda_layers": [l + 1 for l in range(n) if (l + 1) not in self.full_attn_layers],
            },
        }


def _mla_every_4th(n):
    """K3's pattern: every 4th layer (1-based 4, 8, ...) and the last one are MLA."""
    return sorted(set([l for l in range(4, n + 1, 4)] + [n]))


# Presets. `tiny` is exactly `strata ckpt init --preset tiny` (common/model/config.c), with the byte
# tokenizer (ids 0..255 bytes, 256 = BOS, 257 = EOS, vocab 512).
PRESETS = {
    "tiny": dict(
        hidden_size=128, num_hidden_layers=8, vocab_size=512, intermediate_size=256,
        linear_attn_config=dict(num_heads=4, head_dim=32, short_conv_kernel_size=4, gate_lower_bound=-5.0,
                                use_full_rank_gate=True, full_attn_layers=[4, 8]),
        f_rank=32, num_attention_heads=4, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, attn_res_block_size=2, first_k_dense_replace=1,
        num_experts=16, num_experts_per_token=4, num_shared_experts=1, moe_intermediate_size=64,
        routed_expert_hidden_size=64, bos_token_id=256, eos_token_id=257),
    # The main model: 8k-rank BPE + 256 Kimi control ids; ~10-30M parameters (train.py prints it).
    "main": dict(
        hidden_size=320, num_hidden_layers=8, vocab_size=8192 + 256, intermediate_size=768,
        linear_attn_config=dict(num_heads=5, head_dim=64, short_conv_kernel_size=4, gate_lower_bound=-5.0,
                                use_full_rank_gate=True, full_attn_layers=_mla_every_4th(8)),
        f_rank=64, num_attention_heads=5, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64,
        qk_rope_head_dim=32, v_head_dim=64, attn_res_block_size=4, first_k_dense_replace=1,
        num_experts=32, num_experts_per_token=4, num_shared_experts=1, moe_intermediate_size=96,
        routed_expert_hidden_size=160, bos_token_id=8192, eos_token_id=8194),
}


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def situ(a, u, b1, b2):
    return (b1 * torch.tanh(a / b1) * torch.sigmoid(a)) * (b2 * torch.tanh(u / b2))


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


def linear(i, o):
    return nn.Linear(i, o, bias=False)


# ---------------------------------------------------------------- Kimi Delta Attention (SPEC §3)

def kda_recurrent(q, k, v, g, beta, scale, S=None):
    """The definition (SPEC §3.2), token by token. q,k,g [B,T,H,dk], v [B,T,H,dv], beta [B,T,H].
    Returns o [B,T,H,dv] and the final state [B,H,dk,dv]."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    if S is None:
        S = q.new_zeros(B, H, dk, dv)
    out = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        e = beta[:, t].unsqueeze(-1) * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t].unsqueeze(-1) * e.unsqueeze(-2)
        out.append(torch.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
    return torch.stack(out, 1), S


def kda_chunked(q, k, v, g, beta, scale, S=None, C=KDA_TILE):
    """SPEC §3.3 over chunks of C tokens (C = 16: one tile, so the dense diagonal form is safe for
    g >= -5). Each chunk's G is referenced to its middle token, halving the largest exponent.
    Same shapes as kda_recurrent."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % C
    if pad:  # trailing zeros: g = 0, beta = 0, k = 0 leave the outputs of real tokens unchanged
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // C
    # [B,H,N,C,*]
    q, k, v, g = (x.reshape(B, N, C, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))
    beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2)
    G = torch.cumsum(g, dim=3)                       # [B,H,N,C,dk] local cumulative log-decay
    ref = G[:, :, :, C // 2 - 1:C // 2, :]           # NOTE: reference offset per tile (SPEC §3.3)
    Gq = torch.exp(G - ref)
    Gk = torch.exp(ref - G)
    Qg, Kg, Kinv = q * Gq, k * Gq, k * Gk           # Q⊙Γ, K⊙Γ (relative), K/Γ
    A = Kg @ Kinv.transpose(-1, -2)                  # [B,H,N,C,C]: Σ_c k_r k_j exp(G_r − G_j)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(0)
    Akk = torch.where(strict, A * beta.unsqueeze(-1), torch.zeros_like(A))
    Aqk = torch.where(lower, scale * (Qg @ Kinv.transpose(-1, -2)), torch.zeros_like(A))
    I = torch.eye(C, dtype=q.dtype, device=q.device)
    M = I + Akk
    Gabs = torch.exp(G)                              # Γ with the chunk start as reference
    U = torch.linalg.solve_triangular(M, beta.unsqueeze(-1) * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(M, beta.unsqueeze(-1) * (k * Gabs), upper=False, unitriangular=True)
    GC = Gabs[:, :, :, -1:, :]                       # Γ_C [B,H,N,1,dk]
    Kdec = k * torch.exp(G[:, :, :, -1:, :] - G)     # K ⊙ (Γ_C / Γ)
    Qabs = scale * q * Gabs
    if S is None:
        S = q.new_zeros(B, H, dk, dv)
    outs = []
    for n in range(N):
        E = U[:, :, n] - W[:, :, n] @ S
        outs.append(Qabs[:, :, n] @ S + Aqk[:, :, n] @ E)
        S = GC[:, :, n].transpose(-1, -2) * S + Kdec[:, :, n].transpose(-1, -2) @ E
    o = torch.stack(outs, 2)                         # [B,H,N,C,dv]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, dv)[:, :T]
    return o, S


class KDA(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, dk, d = c.kda_heads, c.kda_head_dim, c.hidden_size
        P = H * dk
        self.H, self.dk, self.K = H, dk, c.conv_k
        self.gmin, self.eps = c.gate_lower_bound, c.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj = linear(d, P), linear(d, P), linear(d, P)
        self.q_conv1d = nn.Parameter(torch.empty(P, 1, c.conv_k))
        self.k_conv1d = nn.Parameter(torch.empty(P, 1, c.conv_k))
        self.v_conv1d = nn.Parameter(torch.empty(P, 1, c.conv_k))
        self.f_a_proj, self.f_b_proj = linear(d, c.f_rank), linear(c.f_rank, P)
        self.A_log = nn.Parameter(torch.empty(H))
        self.dt_bias = nn.Parameter(torch.empty(P))
        self.b_proj = linear(d, H)
        self.o_norm = RMSNorm(dk, c.rms_norm_eps)
        self.g_proj = linear(d, P)
        self.o_proj = linear(P, d)
        with torch.no_grad():
            for w in (self.q_conv1d, self.k_conv1d, self.v_conv1d):
                w.zero_()
                w[:, 0, -1] = 1.0          # start as identity (newest token = tap K-1)
                w.add_(0.1 * torch.randn_like(w))
            self.A_log.copy_(torch.log(torch.empty(H).uniform_(1, 16)))
            self.dt_bias.normal_(0, 0.1)

    def conv(self, x, w):  # depthwise causal conv (SPEC §3.1): y_t = Σ_w W[w] x_{t-3+w}
        T = x.shape[1]
        y = F.conv1d(x.transpose(1, 2), w, padding=self.K - 1, groups=x.shape[2])[..., :T]
        return y.transpose(1, 2)

    def gates(self, x):
        B, T, _ = x.shape
        H, dk = self.H, self.dk
        f = self.f_b_proj(self.f_a_proj(x)).view(B, T, H, dk)
        a = torch.exp(self.A_log).view(1, 1, H, 1)
        g = self.gmin * torch.sigmoid(a * (f + self.dt_bias.view(H, dk)))
        beta = torch.sigmoid(self.b_proj(x))
        return g, beta

    def forward(self, x, recurrent=False):
        B, T, _ = x.shape
        H, dk = self.H, self.dk
        q = F.silu(self.conv(self.q_proj(x), self.q_conv1d)).view(B, T, H, dk)
        k = F.silu(self.conv(self.k_proj(x), self.k_conv1d)).view(B, T, H, dk)
        v = F.silu(self.conv(self.v_proj(x), self.v_conv1d)).view(B, T, H, dk)
        q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + L2_EPS)
        k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + L2_EPS)
        g, beta = self.gates(x)
        fn = kda_recurrent if recurrent else kda_chunked
        o, _ = fn(q, k, v, g, beta, 1.0 / math.sqrt(dk))
        o = self.o_norm(o) * torch.sigmoid(self.g_proj(x).view(B, T, H, dk))
        return self.o_proj(o.reshape(B, T, H * dk))


# ---------------------------------------------------------------- gated MLA, NoPE (SPEC §4)

class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, H = c.hidden_size, c.num_attention_heads
        self.H, self.nope, self.rope, self.dv, self.kvr = H, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        dqk = self.nope + self.rope
        if c.q_lora_rank:
            self.q_a_proj = linear(d, c.q_lora_rank)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, MLA_NORM_EPS)
            self.q_b_proj = linear(c.q_lora_rank, H * dqk)
        else:
            self.q_proj = linear(d, H * dqk)
        self.kv_a_proj_with_mqa = linear(d, c.kv_lora_rank + self.rope)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, MLA_NORM_EPS)
        self.kv_b_proj = linear(c.kv_lora_rank, H * (self.nope + self.dv))
        self.gated = c.mla_use_output_gate
        if self.gated:
            self.g_proj = linear(d, H * self.dv)
        self.o_proj = linear(H * self.dv, d)

    def forward(self, x):
        B, T, _ = x.shape
        H, nope, rope, dv = self.H, self.nope, self.rope, self.dv
        if hasattr(self, "q_a_proj"):
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(B, T, H, nope + rope).transpose(1, 2)             # [B,H,T,dqk]
        ckv = self.kv_a_proj_with_mqa(x)
        c, kpe = ckv[..., :self.kvr], ckv[..., self.kvr:]
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, T, H, nope + dv)
        kn, v = kv[..., :nope], kv[..., nope:]
        k = torch.cat([kn, kpe.unsqueeze(2).expand(B, T, H, rope)], -1).transpose(1, 2)
        v = v.transpose(1, 2)
        scale = 1.0 / math.sqrt(nope + rope)
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0; its default scale is ours
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) * scale
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            o = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v
        o = o.transpose(1, 2).reshape(B, T, H * dv)
        if self.gated:
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


# ---------------------------------------------------------------- AttnRes (SPEC §5)

class AttnRes(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(d))       # *_res_norm.weight (γ)
        self.proj = nn.Parameter(torch.zeros(1, d))   # *_res_proj.weight (w): zero = uniform mix at start
        self.eps = eps

    def forward(self, partial, blocks):
        V = torch.stack(list(blocks) + [partial], 0)                     # [S,B,T,d]
        kn = V * torch.rsqrt(V.pow(2).mean(-1, keepdim=True) + self.eps)
        s = (kn * (self.norm * self.proj[0])).sum(-1)                   # [S,B,T]
        p = torch.softmax(s, 0)
        return (p.unsqueeze(-1) * V).sum(0)


# ---------------------------------------------------------------- FFN and latent MoE (SPEC §6, §7)

def mxfp4_fake(w):
    """Round w [..., cols] to MXFP4 (E2M1 codes, E8M0 scale per 32 columns) as export.py stores it;
    returns the dequantised values (no gradient path of its own)."""
    from export import mxfp4_quantize, mxfp4_dequantize  # one definition of the format
    codes, scales = mxfp4_quantize(w.detach())
    return mxfp4_dequantize(codes, scales, w.shape[-1]).to(w.dtype)


class FFN(nn.Module):
    def __init__(self, d, inter, c):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(d, inter), linear(d, inter), linear(inter, d)
        self.b1, self.b2 = c.situ_beta, c.situ_linear_beta

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.b1, self.b2))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, n, ell, mi = c.hidden_size, c.num_experts, c.routed_expert_hidden_size, c.moe_intermediate_size
        self.n, self.k = n, c.num_experts_per_token
        self.renorm, self.rscale = c.moe_renormalize, c.routed_scaling_factor
        self.b1, self.b2 = c.situ_beta, c.situ_linear_beta
        self.gate = nn.Module()
        self.gate.weight = nn.Parameter(torch.randn(n, d) / math.sqrt(d))
        self.gate.register_buffer("e_score_correction_bias", torch.zeros(n))
        self.routed_expert_down_proj = linear(d, ell)
        self.routed_expert_norm = RMSNorm(ell, c.rms_norm_eps)
        self.routed_expert_up_proj = linear(ell, d)
        # experts.J.w1 (gate) / w3 (up) [mi, ell], w2 (down) [ell, mi], stacked over J
        self.w1 = nn.Parameter(torch.randn(n, mi, ell) / math.sqrt(ell))
        self.w3 = nn.Parameter(torch.randn(n, mi, ell) / math.sqrt(ell))
        self.w2 = nn.Parameter(torch.randn(n, ell, mi) / math.sqrt(mi))
        self.shared_experts = FFN(d, c.num_shared_experts * mi, c) if c.num_shared_experts else None
        self.fake_quant = False   # QAT: experts see their MXFP4 values (straight-through gradient)
        self.last_load = None     # [n] tokens per expert of the last forward (for the bias update)
        self.forced = None        # optional [N,k] expert ids (tests)

    def route(self, x):
        s = torch.sigmoid(x.float() @ self.gate.weight.t())                    # [N,n]
        ids = torch.topk(s + self.gate.e_score_correction_bias, self.k, dim=-1).indices
        if self.forced is not None:
            ids = self.forced
        sel = torch.gather(s, 1, ids)
        w = sel / (sel.sum(-1, keepdim=True) + 1e-20) if self.renorm else sel
        return s, ids, w * self.rscale

    def expert_weights(self):
        if not self.fake_quant:
            return self.w1, self.w3, self.w2
        return tuple(w + (mxfp4_fake(w) - w).detach() for w in (self.w1, self.w3, self.w2))

    def forward(self, x):
        shp = x.shape
        x = x.reshape(-1, shp[-1])
        N = x.shape[0]
        s, ids, wts = self.route(x)
        z = self.routed_expert_down_proj(x)                                    # before dispatch
        w1, w3, w2 = self.expert_weights()
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=self.n)
        self.last_load = counts.detach()
        tok = order // self.k
        u = z.new_zeros(N, z.shape[1])
        start = 0
        for j, cnt in enumerate(counts.tolist()):
            if cnt == 0:
                continue
            sl = order[start:start + cnt]
            tj = tok[start:start + cnt]
            start += cnt
            zj = z[tj]
            y = situ(zj @ w1[j].t(), zj @ w3[j].t(), self.b1, self.b2) @ w2[j].t()
            u = u.index_add(0, tj, y * wts.reshape(-1)[sl].unsqueeze(-1))
        out = self.routed_expert_up_proj(self.routed_expert_norm(u))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.reshape(shp)


# ---------------------------------------------------------------- the whole model (SPEC §2)

class Layer(nn.Module):
    def __init__(self, c, l):
        super().__init__()
        d, eps = c.hidden_size, c.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        if c.attn_res_block_size:
            self.self_attention_res = AttnRes(d, eps)
            self.mlp_res = AttnRes(d, eps)
        self.self_attn = MLA(c) if c.is_mla(l) else KDA(c)
        if c.is_moe(l):
            self.block_sparse_moe = MoE(c)
        else:
            self.mlp = FFN(d, c.intermediate_size, c)


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, d)
        nn.init.normal_(self.embed_tokens.weight, std=1.0)
        self.layers = nn.ModuleList([Layer(c, l) for l in range(c.num_hidden_layers)])
        self.norm = RMSNorm(d, c.rms_norm_eps)
        if c.attn_res_block_size:
            self.output_attn_res = AttnRes(d, c.rms_norm_eps)
        self.lm_head = linear(d, c.vocab_size)
        with torch.no_grad():  # residual-out projections start small (deep-net stability)
            for L in self.layers:
                L.self_attn.o_proj.weight.mul_(1.0 / math.sqrt(2 * c.num_hidden_layers))
                ffn = L.block_sparse_moe if hasattr(L, "block_sparse_moe") else None
                if ffn is not None:
                    ffn.routed_expert_up_proj.weight.mul_(1.0 / math.sqrt(2 * c.num_hidden_layers))
                    if ffn.shared_experts is not None:
                        ffn.shared_experts.down_proj.weight.mul_(1.0 / math.sqrt(2 * c.num_hidden_layers))
                else:
                    L.mlp.down_proj.weight.mul_(1.0 / math.sqrt(2 * c.num_hidden_layers))

    def moe_layers(self):
        return [L.block_sparse_moe for L in self.layers if hasattr(L, "block_sparse_moe")]

    def forward(self, ids, recurrent=False):
        """ids [B,T] → logits [B,T,vocab] (fp32)."""
        c = self.c
        Bsz = c.attn_res_block_size
        partial = self.embed_tokens(ids)
        blocks = []
        for l, L in enumerate(self.layers):
            h = partial if not blocks else L.self_attention_res(partial, blocks)
            push = Bsz and l % Bsz == 0
            if push:
                blocks.append(partial)
            xa = L.input_layernorm(h)
            a = L.self_attn(xa, recurrent=recurrent) if isinstance(L.self_attn, KDA) else L.self_attn(xa)
            partial = a if push else partial + a
            h2 = L.mlp_res(partial, blocks) if Bsz else partial
            xm = L.post_attention_layernorm(h2)
            m = L.block_sparse_moe(xm) if hasattr(L, "block_sparse_moe") else L.mlp(xm)
            partial = partial + m
        final = self.output_attn_res(partial, blocks) if Bsz else partial
        return self.lm_head(self.norm(final))

    @torch.no_grad()
    def update_bias(self, rate):
        """Aux-free balancing (DeepSeek-V3): after each step, raise the score-correction bias of
        under-loaded experts and lower that of over-loaded ones by `rate`."""
        for m in self.moe_layers():
            if m.last_load is None:
                continue
            load = m.last_load.float()
            m.gate.e_score_correction_bias.add_(rate * torch.sign(load.mean() - load))


def count_params(model):
    c = model.c
    total = sum(p.numel() for p in model.parameters())
    expert = sum(m.w1.numel() + m.w2.numel() + m.w3.numel() for m in model.moe_layers())
    active = total - expert + expert * c.num_experts_per_token // max(c.num_experts, 1)
    return total, active


# ---------------------------------------------------------------- self-test

def self_test():
    torch.manual_seed(0)
    ok = True
    # chunked vs recurrent KDA, fp64, several lengths (one token, a partial tile, several tiles)
    # and a non-zero incoming state; g at the lower bound's extremes.
    for T in (1, 5, 16, 37, 64):
        B, H, dk, dv = 2, 3, 8, 6
        q = F.normalize(torch.randn(B, T, H, dk, dtype=torch.float64), dim=-1)
        k = F.normalize(torch.randn(B, T, H, dk, dtype=torch.float64), dim=-1)
        v = torch.randn(B, T, H, dv, dtype=torch.float64)
        g = -5.0 * torch.sigmoid(3 * torch.randn(B, T, H, dk, dtype=torch.float64))
        beta = torch.sigmoid(torch.randn(B, T, H, dtype=torch.float64))
        S0 = torch.randn(B, H, dk, dv, dtype=torch.float64)
        o1, s1 = kda_recurrent(q, k, v, g, beta, 0.35, S0)
        o2, s2 = kda_chunked(q, k, v, g, beta, 0.35, S0)
        eo = ((o1 - o2).norm() / o1.norm()).item()
        es = ((s1 - s2).norm() / s1.norm()).item() if T % KDA_TILE == 0 else 0.0
        good = eo < 1e-10 and es < 1e-10
        ok &= good
        print(f"kda chunked vs recurrent T={T}: rel err out {eo:.2e} state {es:.2e} {'ok' if good else 'FAIL'}")
    # fp32: the whole tiny model, chunked vs recurrent KDA
    c = Config(**PRESETS["tiny"])
    m = Model(c).eval()
    with torch.no_grad():
        for L in m.layers:  # make AttnRes and the conv non-trivial
            if hasattr(L, "mlp_res"):
                L.mlp_res.proj.normal_(0, 0.3)
                L.self_attention_res.proj.normal_(0, 0.3)
        ids = torch.randint(0, 256, (2, 45))
        a = m(ids)
        b = m(ids, recurrent=True)
    err = ((a - b).abs().max() / b.abs().max()).item()
    good = err < 1e-5
    ok &= good
    print(f"tiny model, chunked vs recurrent KDA (fp32): max |d|/max|logit| {err:.2e} {'ok' if good else 'FAIL'}")
    # causality: changing a later token leaves earlier logits unchanged
    with torch.no_grad():
        ids2 = ids.clone()
        ids2[:, 30] = (ids2[:, 30] + 1) % 256
        a2 = m(ids2)
    # (rounding only: batched products over a different set of tokens may round differently)
    d = ((a[:, :30] - a2[:, :30]).abs().max() / a.abs().max()).item()
    moved = ((a[:, 30:] - a2[:, 30:]).abs().max() / a.abs().max()).item()
    good = d < 1e-5 and moved > 1e-3
    ok &= good
    print(f"causality: change before the edited position {d:.2e}, from it {moved:.2e} {'ok' if good else 'FAIL'}")
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        torch.set_num_threads(1)
        sys.exit(self_test())
    ap.print_help()
