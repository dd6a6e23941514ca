#!/usr/bin/env python3
"""Concurrent load from ONE process (threads over the OpenAI HTTP API), so that a burst of B
requests is B streams rather than B client processes competing with the servers for the host's
cores. usage: load.py HOST:PORT B PROMPT_TOKENS GEN_TOKENS SEED_BASE [VOCAB (default 32768)]
Each request: a random token-id prompt, GEN_TOKENS tokens with ignore_eos. Prints one line:
ok=N failed=M wall=S tokens=T, then the first 5 distinct errors with their counts (stderr)."""
import collections, json, random, sys, threading, time, urllib.request

host, B, P, G, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = json.load(urllib.request.urlopen(f"http://{host}/v1/models"))["data"][0]["id"]
vocab = int(sys.argv[6]) if len(sys.argv) > 6 else 32768
errors, ok, toks = collections.Counter(), [0], [0]
lock = threading.Lock()


def one(i):
    rng = random.Random(seed + i)
    body = json.dumps({"model": model, "prompt": [rng.randrange(vocab) for _ in range(P)], "max_tokens": G,
                       "ignore_eos": True, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://{host}/v1/completions", body, {"Content-Type": "application/json"})
    try:
        r = json.load(urllib.request.urlopen(req, timeout=300))
        with lock:
            ok[0] += 1
            toks[0] += r["usage"]["completion_tokens"]
    except Exception as e:  # noqa: BLE001 - every failure is counted and shown
        msg = e.read().decode(errors="replace")[:200] if hasattr(e, "read") else str(e)
        with lock:
            errors[msg] += 1


t0 = time.time()
th = [threading.Thread(target=one, args=(i,)) for i in range(B)]
for t in th:
    t.start()
for t in th:
    t.join()
print(f"ok={ok[0]} failed={sum(errors.values())} wall={time.time() - t0:.3f} tokens={toks[0]}")
for m, n in errors.most_common(5):
    print(f"{n} x {m}", file=sys.stderr)
