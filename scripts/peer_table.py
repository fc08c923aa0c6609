#!/usr/bin/env python3
"""The table of a peer comparison: llama.cpp's llama-bench and `webtensor bench --model` on one
GGUF, run in turns (scripts/device_check.sh, scripts/vulkan_peer_bench.sh).

    scripts/peer_table.py RUNS_DIR OUT_JSON

RUNS_DIR holds WHO-ROUND.json (the run's stdout), WHO-ROUND.err (its stderr) and WHO-ROUND.rc
("exit-status seconds") for WHO in llama.cpp-vulkan, llama.cpp-cuda and webtensor. OUT_JSON gets
every run's output and the summary. Each llama.cpp round counts as the mean of its repetitions
(llama-bench's avg_ts); each webtensor round is one sample. Figures are min/median/max over the
rounds; a ratio is webtensor / llama.cpp per round (above 1: webtensor is faster), as
min/median/max of the rounds' ratios.
"""

import glob
import json
import os
import statistics
import sys

PAIRS = [("llama.cpp-vulkan", "wgpu", "Vulkan"), ("llama.cpp-cuda", "cuda", "CUDA")]


def load(runs_dir):
    runs = []
    for rc_path in sorted(glob.glob(os.path.join(runs_dir, "*.rc"))):
        base = rc_path[: -len(".rc")]
        who, _, round_ = os.path.basename(base).rpartition("-")
        rc, seconds = (open(rc_path).read().split() + ["", ""])[:2]
        text = open(base + ".json", errors="replace").read() if os.path.exists(base + ".json") else ""
        try:
            result = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            result = None
        err = open(base + ".err", errors="replace").read() if os.path.exists(base + ".err") else ""
        runs.append(
            {
                "who": who,
                "round": int(round_),
                "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                "seconds": int(seconds) if seconds.isdigit() else None,
                "result": result,
                "stdout": None if result is not None else text[-2000:],
                "stderr_tail": err.splitlines()[-15:],
            }
        )
    return runs


def on_gpu(run):
    """Whether llama-bench found a GPU: without one it runs on the CPU, with empty gpu_info."""
    return isinstance(run["result"], list) and all(t.get("gpu_info") for t in run["result"])


def llama_rate(run, n_prompt, n_gen):
    """llama-bench's mean tokens/s of the test with these lengths in one run on the GPU, or None."""
    if not on_gpu(run):
        return None
    for test in run["result"]:
        if test.get("n_prompt") == n_prompt and test.get("n_gen") == n_gen:
            return test.get("avg_ts")
    return None


def ours(run, backend, key):
    """One webtensor run's sample of `key` (prompt_samples, decode_samples) on `backend`."""
    for row in run["result"] or []:
        if row.get("backend") == backend and row.get(key):
            return row[key][0]
    return None


def spread(values, digits=1):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    if len(values) == 1:
        return f"{mid:.{digits}f}"
    return f"{lo:.{digits}f}/{mid:.{digits}f}/{hi:.{digits}f}"


def main():
    runs_dir, out_json = sys.argv[1], sys.argv[2]
    runs = load(runs_dir)
    by = {(r["who"], r["round"]): r for r in runs}
    rounds = sorted({r["round"] for r in runs})
    mine = [by.get(("webtensor", i)) for i in rounds]
    prompt_tokens = next(
        (row["prompt_tokens"] for r in mine if r and r["result"] for row in r["result"]), None
    )
    decode_tokens = next(
        (row["decode_tokens"] for r in mine if r and r["result"] for row in r["result"]), None
    )
    summary = []
    lines = []
    for peer, backend, api in PAIRS:
        theirs = [by.get((peer, i)) for i in rounds]
        if not any(theirs):
            continue
        first = next((t["result"][0] for t in theirs if t and t["result"]), {})
        lines.append(
            f"llama.cpp {first.get('build_commit', '?')} {api} ({first.get('gpu_info', '?')}, "
            f"{first.get('backends', '?')}) against webtensor {backend}"
        )
        cases = [("decode", f"tg{decode_tokens or 128}", 0, decode_tokens or 128, "decode_samples")]
        prompts = sorted({t["n_prompt"] for r in theirs if r and r["result"] for t in r["result"]
                          if t.get("n_gen") == 0})
        for n in sorted(prompts, key=lambda n: (n != prompt_tokens, n)):
            cases.append(("prompt", f"pp{n}", n, 0, "prompt_samples"))
        for kind, test, n_prompt, n_gen, key in cases:
            a = [llama_rate(t, n_prompt, n_gen) if t else None for t in theirs]
            b = [ours(m, backend, key) if m else None for m in mine]
            like = kind == "decode" or n_prompt == prompt_tokens
            ratios = [y / x for x, y in zip(a, b) if like and x and y]
            what = f"{kind}, {decode_tokens} tokens" if kind == "decode" else f"prompt, {prompt_tokens} tokens"
            summary.append(
                {
                    "backend": backend,
                    "llama_cpp": {"api": api, "test": test, "tokens_per_s": a},
                    "webtensor": {"what": what, "tokens_per_s": b},
                    "ratios": ratios,
                }
            )
            ratio = spread(ratios, 2) if like else f"- ({prompt_tokens} vs {n_prompt} tokens)"
            lines.append(
                f"  {kind:7} llama.cpp {test:6} {spread(a):>22}   webtensor {backend} "
                f"{what:20} {spread(b):>22}   ratio {ratio}"
            )
    header = (
        f"peer comparison, {len(rounds)} rounds in turns (tok/s, min/median/max over the rounds; "
        "ratio: webtensor / llama.cpp per round)"
    )
    notes = [
        "  llama.cpp's tg decodes from an empty context; webtensor decodes after its prompt.",
        "  A llama.cpp round is the mean of its repetitions; a webtensor round is one sample.",
    ]
    for r in runs:
        if r["rc"] != 0:
            notes.append(f"  {r['who']} round {r['round']}: exit status {r['rc']} after {r['seconds']} s")
        elif r["who"].startswith("llama.cpp") and not on_gpu(r):
            notes.append(f"  {r['who']} round {r['round']}: no GPU found (it ran on the CPU), left out")
        elif r["who"] == "webtensor":
            for row in r["result"] or []:
                if not row.get("checked"):
                    notes.append(
                        f"  webtensor {row.get('backend')} round {r['round']}: logits did not "
                        f"match the reference ({row.get('max_abs_error')}), no timing"
                    )
    print("\n".join([header] + lines + notes))
    with open(out_json, "w") as f:
        json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
