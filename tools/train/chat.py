"""Chat-format training samples for the BPE model: one-turn question/answer pairs from the
dictionaries of the corpus (The Devil's Dictionary, the Jargon File), rendered in Kimi K3's chat
format exactly as strata's coordinator renders a request (coordinator/chat.c, after K3's
encoding_k3.py: markup is special ids, every text piece its own BPE segment, no [BOS]), followed by
the reply the model should give: the response channel, then `<|end_of_msg|>`, where strata stops.

Two prompt forms, as a client gets them: thinking on (K3's default: the thinking-effort note, the
generation prompt opens the think channel; the reply closes it empty) and thinking off
(reasoning_effort "none": the generation prompt opens the response channel).
"""
import random
import re

EFFORT_NOTE = ("`thinking_effort` guides on how much to think in your thinking channel (not including the "
               "response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system "
               "is invoked with `thinking_effort=")

QUESTIONS = ["What is {a} {w}?", "What does \"{w}\" mean?", "Define {w}.", "{W}: what is it?",
             "Tell me what {a} {w} is.", "Explain the word \"{w}\"."]


class Seg:
    """Builds one rendering as a list of ids: markers are special ids, text is encoded piece by piece."""

    def __init__(self, tok):
        self.tok, self.ids = tok, []
        self.sp = {"<|open|>": tok.n + 3, "<|close|>": tok.n + 4, "<|sep|>": tok.n + 5, "<|end_of_msg|>": tok.n + 2}

    def mark(self, s):
        self.ids.append(self.sp[s])

    def text(self, s):
        if s:
            self.ids.extend(self.tok.encode(s))

    def open(self, tag):
        self.mark("<|open|>")
        self.text(tag)

    def sep(self):
        self.mark("<|sep|>")

    def close(self, tag):
        self.mark("<|close|>")
        self.text(tag)
        self.mark("<|sep|>")

    def attr(self, key, val):
        self.text(" " + key)
        self.text("=\"")
        self.text(val.replace("&", "&amp;").replace("\"", "&quot;"))
        self.text("\"")

    def end_message(self):
        self.close("message")
        self.mark("<|end_of_msg|>")


def render(tok, question, answer, thinking):
    """(prompt ids, reply ids): the prompt as the coordinator renders [{"role":"user", ...}] with
    thinking on (effort max) or off, and the reply the model is taught."""
    s = Seg(tok)
    if thinking:
        s.open("message")
        s.attr("role", "system")
        s.attr("type", "thinking-effort")
        s.sep()
        s.text(EFFORT_NOTE + "max`.")
        s.end_message()
    s.open("message")
    s.attr("role", "user")
    s.sep()
    s.text(question)
    s.end_message()
    s.open("message")
    s.attr("role", "assistant")
    s.sep()
    s.open("think" if thinking else "response")
    s.sep()
    prompt = s.ids
    s.ids = []
    if thinking:
        s.close("think")
        s.open("response")
        s.sep()
    s.text(answer)
    s.close("response")
    s.end_message()
    return prompt, s.ids


def dictionary_pairs(train_text):
    """(headword, definition) pairs found in the training text: Devil's-Dictionary entries
    ("WORD, n.  text") and Jargon File entries (":word: n. text"), definitions cut to two sentences."""
    pairs = []
    for m in re.finditer(r"(?m)^([A-Z][A-Z' -]{2,30}), (n|v|adj|adv|x|pp|pron|prep|conj)\.\s+(.+?)(?:\n\n|\Z)",
                         train_text, re.S):
        pairs.append((m.group(1).strip().lower(), f"{m.group(1).strip().title()}, {m.group(2)}. {m.group(3)}"))
    for m in re.finditer(r"(?m)^ *:([^:\n]{2,40}): (n|v|adj|adv|vt|vi|interj)\.\n *\n *(?:1\. )?(.+?)(?:\n *\n|\Z)",
                         train_text, re.S):
        pairs.append((m.group(1).strip(), f"{m.group(1).strip()}, {m.group(2)}. {m.group(3)}"))
    out = []
    for w, d in pairs:
        d = re.sub(r"\s+", " ", re.sub(r"\{([^}]*)\}", r"\1", d)).strip()
        sent = re.findall(r".+?[.!?](?:\s|$)", d + " ")
        d = "".join(sent[:2]).strip() if sent else d
        if 20 <= len(d) <= 400:
            out.append((w, d))
    return out


def samples(tok, train_text, seed=1):
    """Token-id lists, one per rendered exchange (prompt + reply), half with thinking on."""
    rng = random.Random(seed)
    out = []
    for w, d in dictionary_pairs(train_text):
        q = rng.choice(QUESTIONS).format(w=w, W=w[:1].upper() + w[1:], a="an" if w[:1].lower() in "aeiou" else "a")
        p, r = render(tok, q, d, thinking=rng.random() < 0.5)
        out.append(p + r)
    return out
