"""Tokenizers of the trained models, as strata reads them (common/model/tokenizer.c).

bytes: one id per byte (0..255), 256 = BOS, 257 = EOS; the folder ships no tokenizer file (strata's
       loader falls back to its byte tokenizer).
bpe:   a tiktoken rank file (`base64(token) rank` per line) written as Kimi's `tiktoken.model`,
       Kimi's pre-tokenisation pattern (python3-regex: its V1 mode has `&&`), Kimi's 256 control ids
       after the ranks, named in tokenizer_config.json's added_tokens_decoder (K3's names).
"""
import base64
import json
import os


class ByteTokenizer:
    kind = "bytes"

    def __init__(self, bos=256, eos=257):
        self.bos, self.eos = bos, eos

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

    def ids(self):
        return {"eos_all": [self.eos]}

    def write(self, out_dir):
        pass  # strata's byte tokenizer needs no file


# Kimi's pattern (checkpoint-layout §8.2), joined with '|'
KIMI_PAT = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# K3's control tokens, by offset after the ranks (checkpoint-layout §8.3); the others are reserved
K3_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
               6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
               19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]"}
K3_NOT_SPECIAL = {"<|open|>", "<|close|>", "<|sep|>"}  # "special": false in K3 (§8.3)


class BpeTokenizer:
    kind = "bpe"

    def __init__(self, ranks):
        """ranks: list of token byte strings, rank = index."""
        import regex  # python3-regex (Debian); only the BPE model needs it
        self.tokens = ranks
        self.rank = {t: i for i, t in enumerate(ranks)}
        self.n = len(ranks)
        self.pat = regex.compile(KIMI_PAT, flags=regex.V1)
        self.bos, self.eos_tok, self.eom, self.pad = self.n, self.n + 1, self.n + 2, self.n + 255
        self.cache = {}

    @classmethod
    def from_tiktoken_file(cls, path, n_ranks):
        """The first n_ranks lines of a tiktoken rank file (`base64 rank`); they must be ranks 0..n-1."""
        toks = []
        with open(path) as f:
            for line in f:
                if len(toks) == n_ranks:
                    break
                b64, r = line.split()
                assert int(r) == len(toks), f"{path}: rank {r} out of order"
                toks.append(base64.b64decode(b64))
        assert len(toks) == n_ranks, f"{path}: only {len(toks)} ranks"
        return cls(toks)

    def _bpe(self, piece):
        ids = self.rank.get(piece)
        if ids is not None:
            return [ids]
        parts = [bytes([b]) for b in piece]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        return [self.rank[p] for p in parts]

    def encode(self, text):
        out = []
        for m in self.pat.finditer(text):
            piece = m.group().encode("utf-8")
            ids = self.cache.get(piece)
            if ids is None:
                ids = self._bpe(piece)
                if len(self.cache) < 500000:
                    self.cache[piece] = ids
            out.extend(ids)
        return out

    def decode(self, ids):
        return b"".join(self.tokens[i] for i in ids if i < self.n).decode("utf-8", "replace")

    def ids(self):
        return {"eos_all": [self.eom, self.eos_tok], "pad": self.pad}

    def write(self, out_dir):
        with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
            for i, t in enumerate(self.tokens):
                f.write(f"{base64.b64encode(t).decode()} {i}\n")
        dec = {}
        for off in range(256):
            text = K3_SPECIALS.get(off, f"<|reserved_token_{self.n + off}|>")
            dec[str(self.n + off)] = {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": text not in K3_NOT_SPECIAL}
        cfg = {"added_tokens_decoder": dec, "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
               "unk_token": "[UNK]", "model_max_length": 1048576, "tokenizer_class": "TikTokenTokenizer",
               "chat_format": "k3"}
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)


# sha256 of the rank files OpenAI publishes (tiktoken_ext/openai_public.py expected_hash)
OPENAI_RANK_SHA256 = {
    "cl100k_base.tiktoken": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base.tiktoken": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}


def load(spec):
    """'bytes', or 'bpe:RANKFILE:N' (the first N ranks of a tiktoken rank file; an OpenAI file is
    checked against OpenAI's published sha256)."""
    if spec == "bytes":
        return ByteTokenizer()
    kind, path, n = spec.split(":")
    assert kind == "bpe"
    want = OPENAI_RANK_SHA256.get(os.path.basename(path))
    if want:
        import hashlib
        got = hashlib.sha256(open(path, "rb").read()).hexdigest()
        assert got == want, f"{path}: sha256 {got} is not OpenAI's {want}"
    return BpeTokenizer.from_tiktoken_file(path, int(n))
