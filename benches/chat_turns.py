#!/usr/bin/env python3
"""Time to first token across the turns of one conversation with `webtensor serve --model`
(issue 43): does turn 8 cost what turn 1 does, or eight prompts?

One greedy conversation of --turns user messages (a long system text first), each answer
streamed and kept in the history, is sent to one server ("warm": the earlier turns' KV
blocks, answers included, are shared with the next turn). The same turns are then sent one by
one each to a freshly started server ("cold": every turn runs its whole history, as a server
without prefix reuse does). Warm and cold alternate run by run; each turn's time to first
token is reported as min / median / max over the runs, with the turn's prompt tokens and the
tokens the warm server served from shared blocks (`/metrics`).

    cargo build --release
    python3 benches/peers.py --make-gguf target/models/smollm-q4_0.gguf --make-only \\
      --dim 576 --layers 30 --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152
    python3 benches/chat_turns.py --runs 3 \
      --server-arg=--chat-template --server-arg=benches/plain_chat.jinja   # the built-in model
    python3 benches/chat_turns.py --model target/models/smollm-q4_0.gguf --system-repeat 8 \
      --max-tokens 32 --runs 3

The built-in model's context (256 tokens) holds eight turns only with a template of a few tokens
a turn (ChatML's markers are not in its vocabulary, so each costs a dozen tokens). An answer's
blocks are reused only where its text tokenizes back to the ids generated: a
trained model's answers do (the built-in one's), a random-weight model's strings of odd pieces
mostly do not, so on those files only the earlier prompts' blocks are reused.

Only worth reading from a quiet machine. Only the standard library.
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import ROOT, start_webtensor  # noqa: E402

SYSTEM = "Answer briefly, as the King James Bible would. "
QUESTIONS = ["Who made the earth?", "What was light?", "Who was Adam?", "What grew there?",
             "Why the flood?", "Who built the ark?", "Who was Abraham?", "What is wisdom?"]


def metric(url, name):
    """One unlabelled sample of `/metrics`."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise SystemExit(f"no {name} in /metrics")


def turn(url, model, messages, max_tokens):
    """One streamed greedy chat completion: (time to first token, the answer's text)."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"turn answered {r.status}: {r.read()[:300]}")
    first, text = None, []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        choices = json.loads(line[5:])["choices"]
        piece = choices and choices[0].get("delta", {}).get("content")
        if piece:
            if first is None:
                first = time.perf_counter() - start
            text.append(piece)
    c.close()
    return first, "".join(text)


def warm(args, conversation):
    """All turns on one server; fills in the answers. Per turn: (ttft, prompt tokens,
    reused tokens)."""
    proc, url, model = start_webtensor(args.binary, args.model, args.server_arg)
    rows = []
    try:
        messages = [{"role": "system", "content": SYSTEM * args.system_repeat}]
        for i in range(args.turns):
            messages = messages + [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
            conversation[i] = list(messages)
            before = (metric(url, "webtensor_prompt_tokens_total"),
                      metric(url, "webtensor_prompt_tokens_reused_total"))
            first, answer = turn(url, model, messages, args.max_tokens)
            # The server counts a request once its answer is sent: wait for the count.
            deadline = time.time() + 10
            while metric(url, "webtensor_prompt_tokens_total") == before[0]:
                if time.time() > deadline:
                    raise SystemExit("the server did not count the turn's prompt tokens")
                time.sleep(0.01)
            after = (metric(url, "webtensor_prompt_tokens_total"),
                     metric(url, "webtensor_prompt_tokens_reused_total"))
            rows.append((first, after[0] - before[0], after[1] - before[1]))
            print(f"turn {i + 1}: {rows[-1][1]:.0f} prompt tokens", file=sys.stderr)
            messages = messages + [{"role": "assistant", "content": answer}]
    finally:
        proc.terminate()
        proc.wait()
    return rows


def cold(args, conversation):
    """Each turn's history on a fresh server: its time to first token."""
    rows = []
    for messages in conversation[: args.turns]:
        proc, url, model = start_webtensor(args.binary, args.model, args.server_arg)
        try:
            rows.append(turn(url, model, messages, args.max_tokens)[0])
        finally:
            proc.terminate()
            proc.wait()
    return rows


def spread(values, scale=1000.0):
    return " / ".join(f"{v * scale:.0f}" for v in (min(values), statistics.median(values),
                                                   max(values)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "webtensor"))
    p.add_argument("--model", default="builtin")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=6)
    p.add_argument("--system-repeat", type=int, default=1,
                   help="the system text this many times (a longer history per turn)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="an extra argument for `webtensor serve` (repeat for more)")
    p.add_argument("-o", "--output", help="also write the figures as JSON here")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    warm_runs, cold_runs = [], []
    for run in range(args.runs):
        conversation = [None] * args.turns
        warm_runs.append(warm(args, conversation))
        cold_runs.append(cold(args, conversation))
        print(f"run {run + 1} of {args.runs} done", file=sys.stderr)
    print("| turn | prompt tokens | reused (warm) | TTFT ms warm (min / median / max) "
          "| TTFT ms cold |")
    print("| --- | --- | --- | --- | --- |")
    table = []
    for t in range(args.turns):
        w = [r[t][0] for r in warm_runs]
        c = [r[t] for r in cold_runs]
        prompt, reused = warm_runs[0][t][1], warm_runs[0][t][2]
        print(f"| {t + 1} | {prompt:.0f} | {reused:.0f} | {spread(w)} | {spread(c)} |")
        table.append({"turn": t + 1, "prompt_tokens": prompt, "reused_tokens": reused,
                      "ttft_warm_s": w, "ttft_cold_s": c})
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "turns": table}, f, indent=1)


if __name__ == "__main__":
    main()
