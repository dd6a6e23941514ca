"""Builds the training text from Debian packages of public-domain or permissively licensed English
prose (README.md lists each package and its licence). Reads the files that `dpkg -x` unpacked under
--root; with --fetch it first runs `apt-get download` + `dpkg -x` itself. Nothing here, and nothing
in train.py, touches the network otherwise.

Output (--out DIR): train.txt, heldout.txt (UTF-8) and manifest.json (sources, bytes, the split).
The held-out text is the last --heldout-frac of every source (whole paragraphs), never trained on.
"""
import argparse
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import zlib

PACKAGES = ["r-cran-janeaustenr", "dict-devil", "jargon-text", "python3.11-doc"]


def fetch(root):
    os.makedirs(root, exist_ok=True)
    debs = os.path.join(root, "debs")
    os.makedirs(debs, exist_ok=True)
    subprocess.check_call(["apt-get", "download"] + PACKAGES, cwd=debs)
    for f in sorted(glob.glob(os.path.join(debs, "*.deb"))):
        subprocess.check_call(["dpkg", "-x", f, root])


# ---- R serialisation (XDR, version 3): just enough for the character vectors of janeaustenr ----

def _r_strings(blob):
    """The character vector stored in one uncompressed R-serialised object."""
    assert blob[:2] == b"X\n", "not an XDR R serialisation"
    p = 2
    version = int.from_bytes(blob[p:p + 4], "big")
    p += 12
    if version == 3:
        n = int.from_bytes(blob[p:p + 4], "big")
        p += 4 + n  # native encoding name
    flags = int.from_bytes(blob[p:p + 4], "big")
    assert flags & 0xFF == 16, "not a STRSXP"
    p += 4
    n = int.from_bytes(blob[p:p + 4], "big")
    p += 4
    out = []
    for _ in range(n):
        fl = int.from_bytes(blob[p:p + 4], "big")
        assert fl & 0xFF == 9, "not a CHARSXP"
        ln = int.from_bytes(blob[p + 4:p + 8], "big", signed=True)
        p += 8
        if ln < 0:
            out.append("")
            continue
        out.append(blob[p:p + ln].decode("utf-8", "replace"))
        p += ln
    return out


def austen(root):
    """Jane Austen's six novels (janeaustenr's lazy-load database: 4-byte length + zlib stream each)."""
    d = open(os.path.join(root, "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"), "rb").read()
    books, i = [], 0
    while i < len(d):
        do = zlib.decompressobj()
        blob = do.decompress(d[i + 4:])
        i = len(d) - len(do.unused_data)
        lines = _r_strings(blob)
        books.append("\n".join(lines).strip() + "\n")
    return books


def devil(root):
    raw = gzip.open(os.path.join(root, "usr/share/dictd/devil.dict.dz")).read().decode("utf-8", "replace")
    return [raw]


def jargon(root):
    return [gzip.open(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz")).read().decode("utf-8", "replace")]


def python_docs(root):
    files = sorted(glob.glob(os.path.join(root, "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"), recursive=True))
    return [open(f, encoding="utf-8", errors="replace").read() for f in files]


SOURCES = [("r-cran-janeaustenr", austen), ("dict-devil", devil), ("jargon-text", jargon),
           ("python3.11-doc", python_docs)]


def clean(t):
    t = t.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    t = re.sub(r"[ ]+\n", "\n", t)
    return re.sub(r"\n{3,}", "\n\n", t)


def split(text, frac):
    """(train, heldout): the last frac of the text, cut at a paragraph boundary."""
    cut = int(len(text) * (1 - frac))
    j = text.find("\n\n", cut)
    cut = j + 2 if j >= 0 else cut
    return text[:cut], text[cut:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="the directory dpkg -x unpacked the packages into")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fetch", action="store_true", help="apt-get download + dpkg -x into --root first")
    ap.add_argument("--heldout-frac", type=float, default=0.02)
    ap.add_argument("--python-docs-mb", type=float, default=4.0,
                    help="at most this much of Python's documentation (reST), so prose stays the majority")
    a = ap.parse_args()
    if a.fetch:
        fetch(a.root)
    os.makedirs(a.out, exist_ok=True)
    train, held, man = [], [], {"sources": [], "heldout_frac": a.heldout_frac}
    for pkg, fn in SOURCES:
        docs = [clean(x) for x in fn(a.root)]
        text = "\n\n".join(d.strip("\n") for d in docs if d.strip()) + "\n"
        if pkg == "python3.11-doc":
            cap = int(a.python_docs_mb * 1e6)
            if len(text) > cap:
                j = text.find("\n\n", cap)
                text = text[:j + 2 if j >= 0 else cap]
        tr, he = split(text, a.heldout_frac)
        train.append(tr)
        held.append(he)
        man["sources"].append({"package": pkg, "documents": len(docs), "train_bytes": len(tr.encode()),
                               "heldout_bytes": len(he.encode())})
        print(f"{pkg}: {len(docs)} documents, train {len(tr.encode())} B, held-out {len(he.encode())} B")
    with open(os.path.join(a.out, "train.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(train))
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(held))
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
