#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (fuzz/corpus/<name>/): a few valid inputs and edge
cases per harness, deterministic. Run from anywhere: python3 fuzz/corpus/make_seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(name, files):
    """Replaces the generated seeds of fuzz/corpus/<name>/; inputs the fuzzers found (found_*) stay."""
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    for fn in os.listdir(d):
        if not fn.startswith("found_"):
            os.remove(os.path.join(d, fn))
    for fn, data in files.items():
        with open(os.path.join(d, fn), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())


# ---- config.json ----
tiny = {
    "architectures": ["KimiK3ForConditionalGeneration"], "bos_token_id": 256, "eos_token_id": 257,
    "text_config": {
        "hidden_size": 128, "num_hidden_layers": 8, "vocab_size": 512, "intermediate_size": 256,
        "rms_norm_eps": 1e-05, "hidden_act": "situ", "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0, "attn_res_block_size": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 32, "mla_use_nope": True, "mla_use_output_gate": True,
        "first_k_dense_replace": 1, "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 1,
        "moe_intermediate_size": 64, "routed_expert_hidden_size": 64, "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "routed_scaling_factor": 1.0,
        "linear_attn_config": {"num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4,
                               "gate_lower_bound": -5.0, "use_full_rank_gate": True,
                               "full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7]}}}
kimi_linear = {
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27, "rms_norm_eps": 1e-5,
    "vocab_size": 163840, "hidden_act": "silu", "num_attention_heads": 32, "num_key_value_heads": 32,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "mla_use_nope": True, "num_experts": 256, "num_experts_per_token": 8,
    "num_shared_experts": 1, "moe_intermediate_size": 1024, "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True, "routed_scaling_factor": 2.446, "first_k_dense_replace": 1,
    "eos_token_id": [163586, 163585], "bos_token_id": 163584,
    "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]}}
k3 = json.loads(json.dumps(tiny))
tc = k3["text_config"]
tc.update({"hidden_size": 7168, "num_hidden_layers": 93, "vocab_size": 163840, "intermediate_size": 33792,
           "attn_res_block_size": 12, "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2,
           "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584, "moe_layer_freq": 1,
           "quantization_config": {"format": "mxfp4-pack-quantized",
                                   "config_groups": {"group_0": {"weights": {"group_size": 32, "num_bits": 4}}}}})
tc["linear_attn_config"].update({"num_heads": 96, "head_dim": 128,
                                 "full_attn_layers": [l for l in range(1, 94) if l % 4 == 0 or l == 93],
                                 "kda_layers": [l for l in range(1, 94) if not (l % 4 == 0 or l == 93)]})
dense_mla = {"hidden_size": 4, "num_hidden_layers": 1, "vocab_size": 8, "num_attention_heads": 1,
             "kv_lora_rank": 4, "qk_nope_head_dim": 4, "v_head_dim": 4, "intermediate_size": 8}
huge_kda = json.loads(json.dumps(tiny))
huge_kda["text_config"]["linear_attn_config"].update({"num_heads": 65536, "head_dim": 65536})
edge_floats = dict(dense_mla, rms_norm_eps=1e-50, activation_situ_beta=1e300, tie_word_embeddings=True)
out("config", {
    "tiny_nested.json": json.dumps(tiny),
    "kimi_linear_flat.json": json.dumps(kimi_linear),
    "k3_mxfp4.json": json.dumps(k3, indent=1),
    "dense_mla.json": json.dumps(dense_mla),
    "huge_kda_width.json": json.dumps(huge_kda),
    "edge_floats.json": json.dumps(edge_floats),
    "real_ints.json": json.dumps(dense_mla).replace("4,", "4.0,"),
    "not_object.json": "[1,2,3]",
    "truncated.json": json.dumps(tiny)[:300],
})


# ---- safetensors: byte 0 even = whole file image, odd = index JSON ----
def st_image(hdr, payload, hl=None, pad=b""):
    h = (json.dumps(hdr, separators=(",", ":")) if isinstance(hdr, dict) else hdr).encode() + pad
    return b"\x00" + struct.pack("<Q", len(h) if hl is None else hl) + h + payload


payload = struct.pack("<6f", 1.5, -2.0, 3.25, 0.0, 1e-3, -7.0) + bytes([0x80, 0x3f, 0, 0xbf, 0, 0x40, 0xc0, 0x43]) + \
    bytes([1, 11, 21, 31, 41]) + b"\0\0\0" + struct.pack("<4f", 0.5, 1, 0, 0)
good = {"__metadata__": {"format": "pt"},
        "language_model.a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [1, 4], "data_offsets": [24, 32]},
        "c": {"dtype": "U8", "shape": [5], "data_offsets": [32, 37]},
        "e": {"dtype": "F16", "shape": [0], "data_offsets": [37, 37]},
        "alog": {"dtype": "F32", "shape": [4], "data_offsets": [40, 56]}}
one = {"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}
index = {"metadata": {"total_size": 32}, "weight_map": {
    "language_model.model.x": "model-00001-of-000002.safetensors",
    "language_model.lm_head.weight": "model-00002-of-000002.safetensors",
    "model.norm.weight": "model-00001-of-000002.safetensors"}}
out("safetensors", {
    "good.bin": st_image(good, payload, pad=b"  "),
    "padded_nul.bin": st_image(one, bytes(8), pad=b"\0\0\0 "),
    "odd_header_length.bin": st_image(one, bytes(8), pad=b" "),  # payload not 2-byte aligned
    "empty_object.bin": st_image("{}", b""),
    "overlap.bin": st_image({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, bytes(8)),
    "length_beyond_file.bin": st_image(one, bytes(8), hl=5000),
    "huge_shape.bin": st_image({"a": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 4]}}, bytes(4)),
    "index.json": b"\x01" + json.dumps(index).encode(),
    "index_path.json": b"\x01" + json.dumps({"weight_map": {"x": "../x.safetensors"}}).encode(),
    "index_empty.json": b"\x01" + b'{"weight_map":{}}',
})

# ---- wire: 64-byte header + payload (strata/wire.h, version 6) ----
MAGIC, VER = 0x57525453, 6


def wire(kind, tokens, experts, width, payload, step=7, layer=1, mb=0, flags=0, src=42, seq=9, status=0, aux=0):
    return struct.pack("<IHHQIHHIIIIQQiI", MAGIC, VER, kind, step, layer, mb, flags, src, tokens, experts, width, seq,
                       len(payload), status, aux) + payload


def pad16(b):
    return b + bytes((-len(b)) % 16)


def table(ids, offs):
    return pad16(struct.pack("<%dI" % len(ids), *ids) + struct.pack("<%dI" % len(offs), *offs))


def pairs(orows, wts):
    """each pair's output row, then its weight"""
    return pad16(struct.pack("<%dI" % len(orows), *orows) + struct.pack("<%df" % len(wts), *wts))


def rows(n, w):
    return pad16(struct.pack("<%df" % (n * w), *[float(i) * 0.5 for i in range(n * w)]))


def rows_bf16(n, w):
    """bf16 bit patterns (the top half of fp32)"""
    return pad16(struct.pack("<%dH" % (n * w), *[struct.unpack("<I", struct.pack("<f", float(i) * 0.5))[0] >> 16
                                                 for i in range(n * w)]))


srcs = pad16(struct.pack("<3I", 0, 1, 0))
# dispatch: 3 pairs (tokens 0, 1 on expert 5; token 0 on expert 9): token 0's two experts in one output row
out("wire", {
    "dispatch.bin": wire(1, 3, 2, 4, table([5, 9], [0, 2, 3]) + pairs([0, 1, 0], [0.25, 0.5, 0.75]) + rows(3, 4),
                         status=3),
    "dispatch_unique.bin": wire(1, 3, 2, 4, table([5, 9], [0, 2, 3]) + srcs + pairs([0, 1, 0], [0.25, 0.5, 0.75]) +
                                rows(2, 4), flags=1, aux=2, status=6),
    "dispatch_one.bin": wire(1, 1, 1, 2, table([0], [0, 1]) + pairs([0], [1.0]) + rows(1, 2), status=1),
    "dispatch_bf16.bin": wire(1, 3, 2, 4, table([5, 9], [0, 2, 3]) + pairs([0, 1, 0], [0.25, 0.5, 0.75]) +
                              rows_bf16(3, 4), flags=2, status=3),
    "dispatch_unique_bf16.bin": wire(1, 3, 2, 3, table([5, 9], [0, 2, 3]) + srcs + pairs([0, 1, 0], [0.25, 0.5, 0.75]) +
                                     rows_bf16(2, 3), flags=3, aux=2, status=6),
    "combine.bin": wire(2, 2, 0, 4, rows(2, 4), aux=1234),
    "empty_dispatch.bin": wire(1, 0, 0, 0, table([], [0])),
    "empty_combine.bin": wire(2, 0, 0, 4, b""),
    "error.bin": wire(3, 0, 0, 0, b"expert 9 of layer 1 is not held here", status=-3),
    "bad_magic.bin": b"XXXX" + wire(1, 1, 1, 1, table([0], [0, 1]) + pairs([0], [1.0]) + rows(1, 1), status=1)[4:],
    "v4_dispatch.bin": wire(1, 3, 2, 4, table([5, 9], [0, 2, 3]) + rows(3, 4), status=3)[:4] + struct.pack("<H", 4) +
                       wire(1, 3, 2, 4, table([5, 9], [0, 2, 3]) + rows(3, 4), status=3)[6:],
    "short_header.bin": wire(1, 1, 1, 1, b"")[:40],
})


# ---- quantile: written by make_quantile_seeds.c (real format-2 summaries need the quantile library) ----
