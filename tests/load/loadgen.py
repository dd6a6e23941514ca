#!/usr/bin/env python3
"""Load and slow-client generator for tests/load/test_load_faults.sh (loopback only, bounded).

  loadgen.py streams URL N MAX_TOKENS [API_KEY]   N concurrent streaming completions; prints a JSON
                                                  summary {"ok": n, "429": n, "other": {...}, "lost": n}
  loadgen.py slow URL N SECONDS [API_KEY]         N connections that send a partial request and
                                                  trickle a byte now and then, while normal requests
                                                  run every 0.2 s; prints {"normal_ok": n, "normal_fail": n, ...}
  loadgen.py one URL [API_KEY]                    one short completion; exit 0 if it finished

Only the Python standard library (asyncio streams, HTTP/1.1 by hand)."""
import asyncio
import json
import sys
import time
from urllib.parse import urlparse


def _hp(url):
    u = urlparse(url)
    return u.hostname, u.port


def _req(host, port, body, key):
    b = json.dumps(body).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"{auth}Content-Length: {len(b)}\r\nConnection: close\r\n\r\n").encode() + b


async def _completion(url, body, key, timeout):
    """Returns (status, finished, text): finished is True when a stream ended with [DONE] or a
    plain response carried choices."""
    host, port = _hp(url)
    r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        w.write(_req(host, port, body, key))
        await w.drain()
        data = await asyncio.wait_for(r.read(), timeout)
    finally:
        w.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = line.split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    text = rest.decode(errors="replace")
    if body.get("stream"):
        finished = "data: [DONE]" in text and '"error"' not in text
    else:
        finished = status == 200 and '"choices"' in text
    return status, finished, text


async def streams(url, n, max_tokens, key):
    body = {"prompt": "load test", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    counts = {"ok": 0, "429": 0, "other": {}, "lost": 0, "examples": []}
    t0 = time.time()

    async def one(i):
        try:
            st, fin, text = await _completion(url, body, key, 300)
        except Exception as e:  # a connection that got no answer at all is lost
            counts["lost"] += 1
            if len(counts["examples"]) < 5:
                counts["examples"].append(f"lost: {type(e).__name__} {e}")
            return
        if st == 200 and fin:
            counts["ok"] += 1
        elif st == 429:
            counts["429"] += 1
        else:
            counts["other"][str(st)] = counts["other"].get(str(st), 0) + 1
            if len(counts["examples"]) < 5:
                counts["examples"].append(f"{st}: {text[:300]}")

    await asyncio.gather(*(one(i) for i in range(n)))
    counts["seconds"] = round(time.time() - t0, 2)
    print(json.dumps(counts))


async def slow(url, n, seconds, key):
    host, port = _hp(url)
    conns, opened, refused = [], 0, 0
    for i in range(n):
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            conns.append((r, w))
            opened += 1
        except Exception:
            refused += 1
    res = {"opened": opened, "refused": refused, "normal_ok": 0, "normal_fail": 0, "examples": []}
    t_end = time.time() + seconds
    body = {"prompt": "hello", "max_tokens": 2}
    while time.time() < t_end:
        for r, w in conns[:50]:  # trickle: keep some of them "active"
            try:
                w.write(b"n")
            except Exception:
                pass
        try:
            st, fin, text = await _completion(url, body, key, 10)
            if st == 200 and fin:
                res["normal_ok"] += 1
            else:
                res["normal_fail"] += 1
                if len(res["examples"]) < 5:
                    res["examples"].append(f"{st}: {text[:200]}")
        except Exception as e:
            res["normal_fail"] += 1
            if len(res["examples"]) < 5:
                res["examples"].append(f"{type(e).__name__} {e}")
        await asyncio.sleep(0.2)
    closed_by_server = 0
    for r, w in conns:  # answered (408) and/or closed by the server: a read returns at once
        try:
            await asyncio.wait_for(r.read(4096), 0.05)
            closed_by_server += 1
        except asyncio.TimeoutError:
            pass
        except Exception:
            closed_by_server += 1
        w.close()
    res["closed_by_server"] = closed_by_server
    print(json.dumps(res))


async def one(url, key):
    st, fin, text = await _completion(url, {"prompt": "hello", "max_tokens": 2}, key, 30)
    print(json.dumps({"status": st, "finished": fin}))
    return 0 if fin else 1


def main():
    cmd, url = sys.argv[1], sys.argv[2]
    if cmd == "streams":
        asyncio.run(streams(url, int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None))
    elif cmd == "slow":
        asyncio.run(slow(url, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None))
    elif cmd == "one":
        sys.exit(asyncio.run(one(url, sys.argv[3] if len(sys.argv) > 3 else None)))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
