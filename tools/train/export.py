"""Writes a trained model in Kimi K3's Hugging Face layout, the one strata's loader reads
(shared/notes/checkpoint-layout.md; common/model/config.c, ckpt.c and ckpt_init.c are the judge):
config.json with text_config, one safetensors shard per decoder layer plus one for the globals
(`model-%05d-of-%06d.safetensors`, names prefixed `language_model.`), model.safetensors.index.json,
routed experts in MXFP4 (compressed-tensors `mxfp4-pack-quantized`), everything else BF16 except
the five F32 kinds (A_log, dt_bias, q/k/v_conv1d, KDA o_norm, e_score_correction_bias),
generation_config.json, and the tokenizer files of tokenizer.py (none for the byte tokenizer).

It also reads such a folder back into the PyTorch model (`load`): the reference logits and the
held-out loss are computed from what was written, so they describe the stored weights exactly.
"""
import json
import math
import os
import struct

import torch

import model as M

PFX = "language_model."

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_MID = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # midpoints between E2M1 magnitudes

QUANT_CONFIG = {
    "config_groups": {"group_0": {
        "format": "mxfp4-pack-quantized", "input_activations": None, "output_activations": None,
        "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32,
                    "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.uint8",
                    "strategy": "group", "symmetric": True, "type": "float", "zp_dtype": None}}},
    "format": "mxfp4-pack-quantized", "global_compression_ratio": None,
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}


# ---------------------------------------------------------------- MXFP4 (checkpoint-layout §6)

def mxfp4_quantize(w):
    """w [..., cols] (cols % 32 == 0) → codes uint8 [..., cols/2] (column 2j in the low nibble),
    E8M0 scales uint8 [..., cols/32]. Scale: the smallest power of two with amax <= 6·2^e; codes:
    nearest E2M1 value, ties to the smaller magnitude."""
    w = w.float()
    cols = w.shape[-1]
    assert cols % 32 == 0
    g = w.reshape(*w.shape[:-1], cols // 32, 32)
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.zeros_like(amax)).clamp(-127, 127)
    x = g / torch.pow(2.0, e).unsqueeze(-1)
    mag = (x.abs().unsqueeze(-1) > _MID.to(x.device)).sum(-1)     # 0..7
    code = mag | ((x < 0) & (mag > 0)).to(mag.dtype) * 8
    code = code.reshape(*w.shape[:-1], cols).to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed, (e + 127).to(torch.uint8)


def mxfp4_dequantize(packed, scales, cols):
    lo, hi = packed & 15, packed >> 4
    code = torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], cols).long()
    v = E2M1.to(packed.device)[code & 7] * (1.0 - 2.0 * (code >= 8).float())
    mul = torch.pow(2.0, scales.float() - 127).repeat_interleave(32, -1)
    return v * mul


# ---------------------------------------------------------------- safetensors

_DT = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "U8": (torch.uint8, 1)}


def _tensor_bytes(t, dt):
    t = t.detach().cpu().contiguous()
    if dt == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    if dt == "F32":
        return t.to(torch.float32).numpy().tobytes()
    return t.to(torch.uint8).numpy().tobytes()


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype str, torch tensor)."""
    hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dt, t in tensors:
        b = _tensor_bytes(t, dt)
        hdr[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        if e["dtype"] == "BF16":
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).float()
        elif e["dtype"] == "F32":
            t = torch.frombuffer(raw, dtype=torch.float32).clone()
        elif e["dtype"] == "U8":
            t = torch.frombuffer(raw, dtype=torch.uint8).clone()
        else:
            raise ValueError(f"{path}: {name}: dtype {e['dtype']}")
        out[name] = t.reshape(e["shape"])
    return out


# ---------------------------------------------------------------- names and dtypes

def layer_tensors(m, l):
    """(name, dtype, tensor) for decoder layer l, K3 names (checkpoint-layout §3)."""
    c, L = m.c, m.layers[l]
    p = f"{PFX}model.layers.{l}."
    out = [(p + "input_layernorm.weight", "BF16", L.input_layernorm.weight),
           (p + "post_attention_layernorm.weight", "BF16", L.post_attention_layernorm.weight)]
    if c.attn_res_block_size:
        out += [(p + "self_attention_res_norm.weight", "BF16", L.self_attention_res.norm),
                (p + "self_attention_res_proj.weight", "BF16", L.self_attention_res.proj),
                (p + "mlp_res_norm.weight", "BF16", L.mlp_res.norm),
                (p + "mlp_res_proj.weight", "BF16", L.mlp_res.proj)]
    a, s = L.self_attn, p + "self_attn."
    if isinstance(a, M.KDA):
        H = c.kda_heads
        alog = torch.zeros((H + 127) // 128 * 128)  # K3 stores [128], zero-padded (§5.1)
        alog[:H] = a.A_log.detach()
        out += [(s + "q_proj.weight", "BF16", a.q_proj.weight), (s + "k_proj.weight", "BF16", a.k_proj.weight),
                (s + "v_proj.weight", "BF16", a.v_proj.weight),
                (s + "q_conv1d.weight", "F32", a.q_conv1d), (s + "k_conv1d.weight", "F32", a.k_conv1d),
                (s + "v_conv1d.weight", "F32", a.v_conv1d),
                (s + "f_a_proj.weight", "BF16", a.f_a_proj.weight), (s + "f_b_proj.weight", "BF16", a.f_b_proj.weight),
                (s + "A_log", "F32", alog), (s + "dt_bias", "F32", a.dt_bias),
                (s + "b_proj.weight", "BF16", a.b_proj.weight), (s + "o_norm.weight", "F32", a.o_norm.weight),
                (s + "g_proj.weight", "BF16", a.g_proj.weight), (s + "o_proj.weight", "BF16", a.o_proj.weight)]
    else:
        if c.q_lora_rank:
            out += [(s + "q_a_proj.weight", "BF16", a.q_a_proj.weight),
                    (s + "q_a_layernorm.weight", "BF16", a.q_a_layernorm.weight),
                    (s + "q_b_proj.weight", "BF16", a.q_b_proj.weight)]
        else:
            out += [(s + "q_proj.weight", "BF16", a.q_proj.weight)]
        out += [(s + "kv_a_proj_with_mqa.weight", "BF16", a.kv_a_proj_with_mqa.weight),
                (s + "kv_a_layernorm.weight", "BF16", a.kv_a_layernorm.weight),
                (s + "kv_b_proj.weight", "BF16", a.kv_b_proj.weight)]
        if c.mla_use_output_gate:
            out += [(s + "g_proj.weight", "BF16", a.g_proj.weight)]
        out += [(s + "o_proj.weight", "BF16", a.o_proj.weight)]
    if not hasattr(L, "block_sparse_moe"):
        f = L.mlp
        return out + [(p + "mlp.gate_proj.weight", "BF16", f.gate_proj.weight),
                      (p + "mlp.up_proj.weight", "BF16", f.up_proj.weight),
                      (p + "mlp.down_proj.weight", "BF16", f.down_proj.weight)]
    e, s = L.block_sparse_moe, p + "block_sparse_moe."
    out += [(s + "gate.weight", "BF16", e.gate.weight),
            (s + "gate.e_score_correction_bias", "F32", e.gate.e_score_correction_bias),
            (s + "routed_expert_down_proj.weight", "BF16", e.routed_expert_down_proj.weight),
            (s + "routed_expert_norm.weight", "BF16", e.routed_expert_norm.weight),
            (s + "routed_expert_up_proj.weight", "BF16", e.routed_expert_up_proj.weight)]
    if e.shared_experts is not None:
        sh = e.shared_experts
        out += [(s + "shared_experts.gate_proj.weight", "BF16", sh.gate_proj.weight),
                (s + "shared_experts.up_proj.weight", "BF16", sh.up_proj.weight),
                (s + "shared_experts.down_proj.weight", "BF16", sh.down_proj.weight)]
    for j in range(c.num_experts):
        for wn, w in (("w1", e.w1[j]), ("w2", e.w2[j]), ("w3", e.w3[j])):
            if c.mxfp4_experts:
                packed, scales = mxfp4_quantize(w)
                out += [(f"{s}experts.{j}.{wn}.weight_packed", "U8", packed),
                        (f"{s}experts.{j}.{wn}.weight_scale", "U8", scales)]
            else:
                out += [(f"{s}experts.{j}.{wn}.weight", "BF16", w)]
    return out


def global_tensors(m):
    c = m.c
    out = [(PFX + "model.embed_tokens.weight", "BF16", m.embed_tokens.weight),
           (PFX + "lm_head.weight", "BF16", m.lm_head.weight),
           (PFX + "model.norm.weight", "BF16", m.norm.weight)]
    if c.attn_res_block_size:
        out += [(PFX + "model.output_attn_res_norm.weight", "BF16", m.output_attn_res.norm),
                (PFX + "model.output_attn_res_proj.weight", "BF16", m.output_attn_res.proj)]
    return out


def config_json(c, tok_ids):
    tc = c.to_text_config()
    if c.mxfp4_experts:
        tc["quantization_config"] = QUANT_CONFIG
    top = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "dtype": "bfloat16",
           "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
           "tie_word_embeddings": c.tie_word_embeddings,
           "strata_note": "trained by tools/train (see training_log.txt beside this file)",
           "text_config": tc}
    if tok_ids.get("pad") is not None:
        top["pad_token_id"] = tc["pad_token_id"] = tok_ids["pad"]
    return top


def export(m, out_dir, tokenizer=None):
    """Write m to out_dir; tokenizer (tokenizer.py) writes its own files. Returns the payload bytes."""
    c = m.c
    os.makedirs(out_dir, exist_ok=True)
    n = c.num_hidden_layers + 1
    wm, total = {}, 0
    with torch.no_grad():
        for i in range(n):
            ts = layer_tensors(m, i) if i < c.num_hidden_layers else global_tensors(m)
            fname = "model-%05d-of-%06d.safetensors" % (i + 1, n)
            total += write_safetensors(os.path.join(out_dir, fname), ts)
            for name, _, _ in ts:
                wm[name] = fname
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    tok_ids = tokenizer.ids() if tokenizer else {}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json(c, tok_ids), f, indent=2)
    gen = {"bos_token_id": c.bos_token_id, "eos_token_id": tok_ids.get("eos_all", [c.eos_token_id]),
           "temperature": 1.0, "top_p": 1.0}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if tokenizer:
        tokenizer.write(out_dir)
    return total


# ---------------------------------------------------------------- reading a folder back

def load(ckpt_dir):
    """The PyTorch model with exactly the weights stored in ckpt_dir (BF16 widened, MXFP4 decoded)."""
    cfg = json.load(open(os.path.join(ckpt_dir, "config.json")))
    tc = dict(cfg.get("text_config", cfg))
    idx = json.load(open(os.path.join(ckpt_dir, "model.safetensors.index.json")))
    st = {}
    for fname in sorted(set(idx["weight_map"].values())):
        st.update(read_safetensors(os.path.join(ckpt_dir, fname)))
    st = {k[len(PFX):] if k.startswith(PFX) else k: v for k, v in st.items()}
    kda0 = next(l for l in range(tc["num_hidden_layers"]) if (l + 1) not in tc["linear_attn_config"]["full_attn_layers"])
    tc["f_rank"] = st[f"model.layers.{kda0}.self_attn.f_a_proj.weight"].shape[0]
    tc["mxfp4_experts"] = "quantization_config" in tc
    c = M.Config(**tc)
    m = M.Model(c)
    ref = {}
    for i in range(c.num_hidden_layers + 1):
        ts = layer_tensors(m, i) if i < c.num_hidden_layers else global_tensors(m)
        for name, _, t in ts:
            ref[name[len(PFX):]] = t
    used = set()
    with torch.no_grad():
        for name, t in ref.items():
            if name.endswith(".weight_packed") or name.endswith(".weight_scale"):
                continue
            src = st[name]
            used.add(name)
            if name.endswith("self_attn.A_log"):  # stored padded; the parameter is [H]
                a = m.layers[int(name.split(".")[2])].self_attn.A_log
                assert not src[a.shape[0]:].any(), f"{name}: non-zero padding"
                a.copy_(src[:a.shape[0]])
            else:
                t.copy_(src.reshape(t.shape))
        for l, L in enumerate(m.layers):
            if not hasattr(L, "block_sparse_moe"):
                continue
            e = L.block_sparse_moe
            for j in range(c.num_experts):
                for wn, w in (("w1", e.w1), ("w2", e.w2), ("w3", e.w3)):
                    s = f"model.layers.{l}.block_sparse_moe.experts.{j}.{wn}."
                    if c.mxfp4_experts:
                        w[j].copy_(mxfp4_dequantize(st[s + "weight_packed"], st[s + "weight_scale"], w.shape[-1]))
                        used.update([s + "weight_packed", s + "weight_scale"])
                    else:
                        w[j].copy_(st[s + "weight"])
                        used.add(s + "weight")
    left = set(st) - used
    assert not left, f"{ckpt_dir}: tensors the model does not use: {sorted(left)[:5]}"
    return m.eval()
