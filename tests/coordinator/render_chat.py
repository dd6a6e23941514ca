#!/usr/bin/env python3
"""The reference for Strata's chat rendering: Debian's python3-jinja2 renders the official Kimi
chat template text (data/*.jinja) the way Hugging Face transformers does (apply_chat_template):
an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension,
and transformers' own tojson filter (json.dumps, ensure_ascii=False), add_generation_prompt=True.
Writes {"render": [one string per case], "tojson": [json.dumps(tools) per case, null without]}.
  render_chat.py TEMPLATE CASES.json OUT.json"""
import json, sys
import jinja2, jinja2.ext, jinja2.sandbox


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                   extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
template = env.from_string(open(sys.argv[1], encoding="utf-8").read())
cases = json.load(open(sys.argv[2], encoding="utf-8"))
out = {"render": [], "tojson": []}
for c in cases:
    kw = {"messages": c["messages"], "add_generation_prompt": True}
    if c.get("tools"):
        kw["tools"] = c["tools"]
    out["render"].append(template.render(**kw))
    out["tojson"].append(tojson(c["tools"]) if "tools" in c else None)
json.dump(out, open(sys.argv[3], "w", encoding="utf-8"), ensure_ascii=False)
