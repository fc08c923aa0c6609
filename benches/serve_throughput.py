"""Throughput of `webtensor serve --model` under 1, 4 and 16 concurrent OpenAI clients.

Starts the server (or uses a running one with --base-url), then for each concurrency level
runs that many client threads with the `openai` package from PyPI; each client sends
--requests completions of --max-tokens tokens (greedy, so every run does the same work) and
the aggregate rate is generated tokens over wall time. The server batches the concurrent
requests into one decode step, so the aggregate rate should grow with the clients while each
client's own rate falls more slowly. Time it on a quiet machine with a release build:

    cargo build --release
    python3 benches/serve_throughput.py --model builtin --runs 3
    python3 benches/serve_throughput.py --model path/to/model.gguf --max-tokens 64 --runs 3

Prints a table (min/median/max over --runs alternating runs) and, with --json FILE, writes it.
"""

import argparse
import json
import statistics
import subprocess
import threading
import time

import openai

PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the"]


def start_server(binary, model, extra):
    cmd = [binary, "serve", "--port", "0", "--model", model, "--max-sequences", "16", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "OpenAI API at " not in line:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, line.split("OpenAI API at ")[1].split(" ")[0]


def one_level(client, model, clients, requests, max_tokens):
    """Runs `clients` threads of `requests` completions each; returns (tokens/s, tokens)."""
    tokens = [0] * clients
    errors = []

    def work(i):
        try:
            for r in range(requests):
                out = client.completions.create(
                    model=model, prompt=PROMPTS[(i + r) % len(PROMPTS)],
                    max_tokens=max_tokens, temperature=0)
                tokens[i] += out.usage.completion_tokens
        except Exception as e:  # noqa: BLE001 - reported after the run
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{clients} clients: {errors[0]}")
    return sum(tokens) / wall, sum(tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="builtin", help="what `serve --model` loads")
    ap.add_argument("--binary", default="target/release/webtensor")
    ap.add_argument("--base-url", help="a running server's /v1 address instead of starting one")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="more arguments for `serve` (repeatable), e.g. --server-arg=--backend=cpu")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--requests", type=int, default=4, help="completions per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    proc = None
    base = args.base_url
    if base is None:
        proc, base = start_server(args.binary, args.model, args.server_arg)
    try:
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        levels = [int(n) for n in args.levels.split(",")]
        one_level(client, model, 1, 1, 4)  # warm-up
        rates = {n: [] for n in levels}
        for _ in range(args.runs):  # alternate the levels within each run
            for n in levels:
                rates[n].append(one_level(client, model, n, args.requests, args.max_tokens)[0])
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()

    print(f"model {model}: {args.requests} completions of {args.max_tokens} tokens per client, "
          f"{args.runs} runs")
    print(f"{'clients':>7}  {'tokens/s min':>12}  {'median':>8}  {'max':>8}  {'per client':>10}")
    rows = []
    for n in levels:
        r = rates[n]
        med = statistics.median(r)
        print(f"{n:>7}  {min(r):>12.1f}  {med:>8.1f}  {max(r):>8.1f}  {med / n:>10.1f}")
        rows.append({"clients": n, "tokens_per_sec": r, "median": med})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": model, "max_tokens": args.max_tokens,
                       "requests_per_client": args.requests, "levels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
