#!/usr/bin/env python3
"""A bounded soak of an OpenAI-compatible server, and the same load against a peer server.

Soak (issue 43): CLIENTS threads send chat completions for DURATION seconds, streamed and
whole ones mixed, and some hang up on purpose (a streamed request closed after its first
chunk, a whole one closed before its answer). It reports:

* every answer that is not a declared one: 200, or 503 with Retry-After when the queue is
  full (a hang-up is ours, not an error); the run fails if there is any other;
* the server's RSS every few seconds, and its growth after the warm-up (the first fifth of
  the run): at most --max-growth-mib (8) or the run fails;
* p50/p99 of the whole requests' latency and of the streamed ones' time to first token, and
  the aggregate generated tokens per second.

    cargo build --release
    python3 benches/soak.py --duration 600 --clients 64            # webtensor serve, builtin

Levels (--levels): streamed completions of plain prompts from 1, 4 and 16 clients (no
hang-ups) against `webtensor serve --model` alone (its aggregate tokens/s should grow with the
clients, which share each decode step), or with --gguf side by side with a peer: the same
completions (no chat template, so both do the same work) against
`webtensor serve` and llama-cpp-python's own server (`python3 -m llama_cpp.server`, which
needs `pip install 'llama-cpp-python[server]'`) on the same GGUF, alternating the servers run
by run; aggregate tokens/s and p50/p99 time to first token, min/median/max over the runs.
Time it on a quiet machine:

    python3 benches/peers.py --make-gguf target/tiny-kjv.gguf --make-only   # the builtin model
    python3 benches/soak.py --levels 1,4,16 --runs 3                    # webtensor, builtin
    python3 benches/soak.py --levels 1,4,16 --gguf target/tiny-kjv.gguf --runs 3

Only the standard library: requests go over http.client, so a hang-up is a closed socket.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the",
           "Tell me about the flood", "Who was Moses?", "What is wisdom?", "Sing a psalm"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, what, seconds=300):
    """Polls `url`/v1/models until it answers 200 (or the process ends)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} ended with {proc.returncode} before it was ready")
        try:
            host, port = urllib.parse.urlsplit(url).netloc.split(":")
            c = http.client.HTTPConnection(host, int(port), timeout=5)
            c.request("GET", "/v1/models")
            r = c.getresponse()
            body = r.read()
            if r.status == 200:
                return json.loads(body)["data"][0]["id"]
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} was not ready within {seconds} s")


def start_webtensor(binary, model, extra):
    port = free_port()
    cmd = [binary, "serve", "--port", str(port), "--model", model, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    return proc, url, wait_ready(url, proc, "webtensor serve")


def start_llama_cpp(gguf, ctx, threads):
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(port),
           "--n_ctx", str(ctx), "--n_threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    return proc, url, wait_ready(url, proc, "llama_cpp.server")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Outcome:
    """What one request came to."""

    def __init__(self, status, tokens=0, first=None, total=None, retry_after=None, hung_up=False):
        self.status, self.tokens, self.first, self.total = status, tokens, first, total
        self.retry_after, self.hung_up = retry_after, hung_up


def request(url, model, prompt, max_tokens, stream, hang_up=False, chat=True, timeout=600):
    """One completion over a fresh connection: a chat message, or with `chat` false a plain
    prompt (no template, so two servers do the same work); `hang_up` closes it early on
    purpose. A streamed answer counts a token per chunk with text."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    fields = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if chat:
        fields["messages"] = [{"role": "user", "content": prompt}]
    else:
        fields["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    start = time.perf_counter()
    try:
        c.request("POST", path, json.dumps(fields), {"Content-Type": "application/json"})
        sock = c.sock  # the response takes it over; kept to hang up on purpose

        def close():
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()

        if hang_up and not stream:
            close()  # before the answer: the server should cancel the request
            return Outcome(None, hung_up=True)
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return Outcome(r.status, retry_after=r.getheader("Retry-After"))
        if not stream:
            answer = json.loads(r.read())
            total = time.perf_counter() - start
            return Outcome(200, answer["usage"]["completion_tokens"], total, total)
        tokens, first = 0, None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choice = json.loads(line[5:])["choices"]
            text = choice and (choice[0].get("delta", {}).get("content") if chat else choice[0].get("text"))
            if text:
                tokens += 1
                if first is None:
                    first = time.perf_counter() - start
                    if hang_up:
                        close()
                        return Outcome(None, tokens, first, hung_up=True)
        return Outcome(200, tokens, first, time.perf_counter() - start)
    finally:
        c.close()


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def soak(args):
    proc, url, model = start_webtensor(args.binary, args.model, args.server_arg)
    outcomes, lock = [], threading.Lock()
    stop_at = time.time() + args.duration
    samples = []

    def client(i):
        rng = random.Random(i)
        while time.time() < stop_at:
            stream = rng.random() < 0.5
            hang_up = rng.random() < args.hang_up
            try:
                o = request(url, model, rng.choice(PROMPTS), args.max_tokens, stream, hang_up)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                o = Outcome(f"{type(e).__name__}: {e}")
            with lock:
                outcomes.append((time.time(), stream, o))
            if o.status == 503:
                time.sleep(float(o.retry_after or 1))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    start = time.time()
    for t in threads:
        t.start()
    while time.time() < stop_at:
        samples.append((time.time() - start, rss_mib(proc.pid)))
        time.sleep(min(5, max(0.1, stop_at - time.time())))
    for t in threads:
        t.join()
    samples.append((time.time() - start, rss_mib(proc.pid)))
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()

    wall = time.time() - start
    warm = args.duration / 5
    after = [m for t, m in samples if t >= warm]
    growth = max(after) - after[0] if after else float("nan")
    statuses = {}
    for _, _, o in outcomes:
        key = "hung up" if o.hung_up else str(o.status)
        statuses[key] = statuses.get(key, 0) + 1
    undeclared = {k: n for k, n in statuses.items() if k not in ("200", "503", "hung up")}
    whole = [o.total for _, s, o in outcomes if not s and o.status == 200]
    ttft = [o.first for _, s, o in outcomes if s and o.status == 200 and o.first is not None]
    tokens = sum(o.tokens for _, _, o in outcomes)
    report = {
        "clients": args.clients, "duration_s": round(wall, 1), "requests": len(outcomes),
        "answers": statuses, "undeclared": undeclared,
        "rss_mib": {"start": samples[0][1], "after_warmup": after[0] if after else None,
                    "max": max(m for _, m in samples), "end": samples[-1][1],
                    "growth_after_warmup": growth},
        "whole_latency_s": {"p50": percentile(whole, 50), "p99": percentile(whole, 99),
                            "n": len(whole)},
        "stream_ttft_s": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99), "n": len(ttft)},
        "tokens_per_s": tokens / wall,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    failed = []
    if undeclared:
        failed.append(f"undeclared answers: {undeclared}")
    if not growth <= args.max_growth_mib:
        failed.append(f"RSS grew {growth:.1f} MiB after the warm-up (limit {args.max_growth_mib})")
    if failed:
        raise SystemExit("soak failed: " + "; ".join(failed))


def one_level(url, model, clients, requests, max_tokens):
    """`clients` threads of `requests` streamed completions: (tokens/s, TTFTs)."""
    results, lock = [], threading.Lock()

    def work(i):
        for r in range(requests):
            o = request(url, model, PROMPTS[(i + r) % len(PROMPTS)], max_tokens, True, chat=False)
            if o.status != 200:
                raise SystemExit(f"{clients} clients: answer {o.status}")
            with lock:
                results.append(o)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return sum(o.tokens for o in results) / wall, [o.first for o in results if o.first is not None]


def peer_table(args):
    levels = [int(n) for n in args.levels.split(",")]
    model = args.gguf or args.model
    servers = {
        "webtensor": lambda: start_webtensor(args.binary, model,
                                             ["--max-sequences", str(max(levels))] + args.server_arg),
    }
    if args.gguf:
        servers["llama.cpp server"] = lambda: start_llama_cpp(args.gguf, args.ctx, args.threads)
    rates = {(s, n): [] for s in servers for n in levels}
    ttfts = {(s, n): [] for s in servers for n in levels}
    for _ in range(args.runs):
        for name, start in servers.items():  # alternate the servers within each run
            proc, url, model = start()
            try:
                one_level(url, model, 1, 1, 4)  # warm-up
                for n in levels:
                    rate, first = one_level(url, model, n, args.requests, args.max_tokens)
                    rates[(name, n)].append(rate)
                    ttfts[(name, n)].extend(first)
            finally:
                proc.kill()
                proc.wait()
    print(f"{model}: {args.requests} streamed completions of {args.max_tokens} tokens "
          f"per client, {args.runs} runs alternating the servers")
    print("| server | clients | tokens/s min / median / max | TTFT p50 / p99 ms |")
    print("| --- | --- | --- | --- |")
    rows = []
    for n in levels:
        for name in servers:
            r, t = rates[(name, n)], ttfts[(name, n)]
            print(f"| {name} | {n} | {min(r):.1f} / {statistics.median(r):.1f} / {max(r):.1f} | "
                  f"{percentile(t, 50) * 1e3:.0f} / {percentile(t, 99) * 1e3:.0f} |")
            rows.append({"server": name, "clients": n, "tokens_per_s": r,
                         "ttft_p50_s": percentile(t, 50), "ttft_p99_s": percentile(t, 99)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "webtensor"))
    ap.add_argument("--model", default="builtin",
                    help="what `serve --model` loads (for --levels without --gguf too)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="more arguments for `webtensor serve` (repeatable)")
    ap.add_argument("--duration", type=float, default=600, help="soak: seconds")
    ap.add_argument("--clients", type=int, default=64, help="soak: concurrent clients")
    ap.add_argument("--hang-up", type=float, default=0.1, help="soak: share of requests closed early")
    ap.add_argument("--max-growth-mib", type=float, default=8.0)
    ap.add_argument("--levels", help="peer table: client counts, e.g. 1,4,16")
    ap.add_argument("--gguf", help="levels: the GGUF both webtensor and llama.cpp's server load")
    ap.add_argument("--ctx", type=int, default=2048, help="peer table: llama.cpp's n_ctx")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="peer table: llama.cpp's threads")
    ap.add_argument("--requests", type=int, default=2, help="peer table: completions per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.levels:
        peer_table(args)
    else:
        soak(args)


if __name__ == "__main__":
    main()
