"""Where a training step's GPU time goes: splits a Kineto (Chrome) trace into GEMM, attention, loss, norm,
elementwise, optimizer, copies and idle time (docs/performance.md, "Where the step's time goes").

The trace is what `bench_gpu_train_step --profile FILE` writes (LibTorch's Kineto profiler over whole steps). Each GPU
kernel is put in one category by its name; the window is from the first GPU activity to the last; "idle" is the part
of the window in which no kernel, copy or memset ran (host gaps: launches, synchronisations, data loading). Without
GPU events (a CPU run) it splits the CPU operators' self times instead, by the same names.

    python3 benchmarks/gpu_profile.py TRACE.json [--steps N] [--json OUT.json]
"""
import argparse
import json
import re
import sys

# First match wins: the order resolves overlaps (a fused softmax in attention is attention; a GEMM in the loss's
# head is a GEMM).
CATEGORIES = [
    ("attention", r"flash|fmha|attention|sdpa|_efficient_attention|cudnn.*mha"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|sm100_|_mm_|matmul|scaled_mm|addmm|\bmm\b|bmm|linear"),
    ("loss", r"log_softmax|softmax|nll_loss|cross_entropy|logsumexp|scatter_add|gather"),
    ("optimizer", r"adam|lion|fused_adamw|multi_tensor|foreach|_amp_|sgd"),
    ("norm", r"layer_norm|layernorm|rms_?norm|norm_kernel|batch_norm"),
    ("embedding", r"embedding|index_select|indexing_backward|index_put"),
    ("reduction", r"reduce_kernel|reduction|sum_|mean_|amax|max_"),
    ("elementwise", r"elementwise|vectorized|unrolled|copy_kernel|fill|where|mul|add|gelu|silu|cat|clamp|pow|exp"),
]
COPIES = ("gpu_memcpy", "gpu_memset")


def category(name):
    n = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, n):
            return label
    return "other"


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def split(trace):
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") == "kernel" or e.get("cat") in COPIES]
    device = "gpu" if gpu else "cpu"
    if not gpu:
        # CPU: each operator's self time (its duration less that of the operators it calls), so that nested calls
        # (autograd's nodes, ATen's composites) count once, where the work is.
        ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
        stack = []
        for e in ops:
            e = dict(e, self_us=e["dur"])
            while stack and (stack[-1]["tid"] != e["tid"] or e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]):
                stack.pop()
            if stack:
                stack[-1]["self_us"] -= e["dur"]
            stack.append(e)
            gpu.append(e)
    if not gpu:
        return None
    start = min(e["ts"] for e in gpu)
    stop = max(e["ts"] + e["dur"] for e in gpu)
    window = stop - start
    by = {}
    for e in gpu:
        label = "copies" if e.get("cat") in COPIES else category(e.get("name", ""))
        count, us = by.get(label, (0, 0.0))
        by[label] = (count + 1, us + e.get("self_us", e["dur"]))
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    return {"device": device, "window_us": window, "busy_us": busy, "idle_us": window - busy,
            "categories": {k: {"count": c, "us": us} for k, (c, us) in sorted(by.items(), key=lambda kv: -kv[1][1])}}


def table(result, steps):
    w = result["window_us"]
    lines = [f"| part ({result['device']}) | kernels per step | ms per step | share |", "|---|---:|---:|---:|"]
    for k, v in result["categories"].items():
        lines.append(f"| {k} | {v['count'] / steps:.0f} | {v['us'] / 1e3 / steps:.2f} | {100 * v['us'] / w:.1f}% |")
    lines.append(f"| idle (host gaps, syncs, data) | | {result['idle_us'] / 1e3 / steps:.2f} | "
                 f"{100 * result['idle_us'] / w:.1f}% |")
    lines.append(f"| **step** | | **{w / 1e3 / steps:.2f}** | 100% |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=1, help="steps in the trace (figures are per step)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with open(args.trace) as f:
        result = split(json.load(f))
    if result is None:
        print(f"{args.trace}: no operator or kernel events", file=sys.stderr)
        return 1
    result["steps"] = args.steps
    print(table(result, args.steps))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
