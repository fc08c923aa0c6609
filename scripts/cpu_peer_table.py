#!/usr/bin/env python3
"""The cpu speed table of issue 41 against llama.cpp: `webtensor bench --model F --backend cpu
--threads T --peers` for every model file and thread count given, each of our samples followed
by one llama.cpp sample on the same file (llama-cpp-python, the same thread count), so both see
the same machine. Prints a markdown table of each cell's ratio webtensor / llama.cpp (above 1:
webtensor is faster) as min / median / max over the rounds, with both sides' median tokens/s,
and both sides' peak resident memory for the same work.

    scripts/cpu_peer_table.py [--force] [--runs 3] [--threads 1,2] [-o OUT.json] MODEL.gguf...

The model files of the table (random weights in the shapes of SmolLM-135M and TinyLlama-1.1B):

    python3 benches/peers.py --make-gguf target/models/smollm-q4_k_m.gguf --make-only \\
      --type q4_k_m --dim 576 --layers 30 --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152
    python3 benches/peers.py --make-gguf target/models/tinyllama-q4_k_m.gguf --make-only \\
      --type q4_k_m --dim 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000

(`--type` q4_0, q8_0, q4_k_m, q6_k; the mixes need llama-cpp-python, as `--peers` does.)

Timing is only worth reporting on a quiet machine: this refuses to start when the 1-minute
load average is above 0.5, unless --force. Needs target/release/webtensor (`cargo build
--release`) and llama-cpp-python importable by the `python3` on PATH.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spread(values, digits=1):
    """`min / median / max` of `values`."""
    return " / ".join(f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def cell(row, key):
    """One table cell: the per-round ratios and both sides' medians of one measure."""
    ours, theirs = row[f"{key}_samples"], row["peer"][f"{key}_samples"]
    ratios = [a / b for a, b in zip(ours, theirs)]
    return (f"{spread(ratios, 2)} ({statistics.median(ours):.1f} vs "
            f"{statistics.median(theirs):.1f} tok/s)")


def rss(row):
    """Both sides' peak resident memory (ours from the model's load to the last sample, the
    peer's whole Python process) and their ratio, where both were measured."""
    ours, theirs = row.get("peak_rss_bytes"), row["peer"].get("peak_rss_bytes")
    if not ours or not theirs:
        return "–"
    return f"{ours / 1e6:.0f} / {theirs / 1e6:.0f} MB ({ours / theirs:.2f}×)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--runs", type=int, default=3, help="rounds per cell (at least 3 to report)")
    ap.add_argument("--webtensor", default=os.path.join(ROOT, "target", "release", "webtensor"))
    ap.add_argument("--force", action="store_true", help="time even on a busy machine")
    ap.add_argument("-o", "--out", help="write every run's JSON rows here")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    if load > 0.5 and not args.force:
        sys.exit(f"cpu_peer_table: the 1-minute load average is {load:.2f}; time on a quiet "
                 "machine (or pass --force, whose figures are not worth reporting)")
    results = []
    print("| model | threads | prefill ratio | decode ratio | peak RSS, ours / llama.cpp |")
    print("| --- | --- | --- | --- | --- |")
    for model in args.models:
        for threads in args.threads.split(","):
            out = subprocess.run(
                [args.webtensor, "bench", "--model", model, "--backend", "cpu", "--threads", threads,
                 "--runs", str(args.runs), "--peers", "--json"],
                capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"cpu_peer_table: bench on {model} with {threads} threads failed:\n{out.stderr}")
            doc = json.loads(out.stdout)
            rows = doc["rows"] if isinstance(doc, dict) else doc
            row = next(r for r in rows if r.get("peer"))
            results.append({"model": model, "threads": int(threads), "row": row})
            print(f"| {os.path.basename(model)} | {threads} | {cell(row, 'prompt')} | "
                  f"{cell(row, 'decode')} | {rss(row)} |", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f} (before: {load:.2f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
