#!/usr/bin/env python3
"""Writes Kimi's tokenizer files into a checkpoint folder for tests: tiktoken.model with the 256
single-byte tokens as ranks 0..255, and tokenizer_config.json with Kimi Linear / K2's added tokens
(names and offsets from Kimi's tokenizer_config.json) from id 256 on, so a `strata ckpt init
--preset tiny` folder (vocab 512) has an embedding row for every id. With config.json there, its
bos/eos/pad become Kimi Linear's ([BOS], <|im_end|>, [PAD]) at these offsets.
With --k3: K3's names for the same ids (<|end_of_msg|>, <|open|>, <|close|>, <|sep|>, the last three
not special, as K3's tokenizer_config.json marks them) and two merged tokens, '="' and '="&', so a
test can tell text encoded piece by piece from text encoded in one run.
  kimi_tokenizer.py DIR [--k3]"""
import base64, json, os, sys

SPECIAL = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
           6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
           11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
           14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
           18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
           22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]"}
# Kimi marks the tool-call markers and <think> as not special (they stay in decoded text)
NOT_SPECIAL = {11, 12, 13, 14, 15, 22, 23}

K3_SPECIAL = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
              6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
              19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]"}
K3_NOT_SPECIAL = {3, 4, 5}

d = sys.argv[1]
k3 = "--k3" in sys.argv[2:]
if k3:
    SPECIAL, NOT_SPECIAL = K3_SPECIAL, K3_NOT_SPECIAL
tokens = [bytes([r]) for r in range(256)] + ([b'="', b'="&'] if k3 else [])
n = len(tokens)
with open(os.path.join(d, "tiktoken.model"), "w") as f:
    for r, t in enumerate(tokens):
        f.write(f"{base64.b64encode(t).decode()} {r}\n")
added = {str(n + k): {"content": v, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": k not in NOT_SPECIAL} for k, v in SPECIAL.items()}
json.dump({"added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
           "unk_token": "[UNK]"}, open(os.path.join(d, "tokenizer_config.json"), "w"), indent=1)
cfg = os.path.join(d, "config.json")
if os.path.exists(cfg):
    c = json.load(open(cfg))
    for o in (c, c.get("text_config")):
        if isinstance(o, dict):
            o.update(bos_token_id=n, eos_token_id=n + 2, pad_token_id=n + 255)
    json.dump(c, open(cfg, "w"), indent=1)
