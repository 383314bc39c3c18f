"""One GPU: Tessera's training step against the same step in plain PyTorch, in one run on the same GPU.

For the MPT shapes of recipes/mpt-125m.yaml, mpt-350m.yaml and mpt-1b.yaml at sequence 2048 in amp_bf16 (bf16
autocast of forward and loss, fp32 weights and AdamW state), one microbatch per step, gradient clipping at norm 1.0:

- Tessera (`bench_gpu_train_step`): the whole step as `train` runs it (MDS data loading, forward, backward,
  clipping, decoupled AdamW), twice: the recipe's own architecture (learned positions, biases; SDPA flash attention)
  and the architecture HF's class implements (ALiBi, no biases, plain LayerNorm; SDPA with an additive mask).
- PyTorch: Hugging Face's `MptForCausalLM` (the class people train MPT with in plain PyTorch) on that second
  architecture, eager and under `torch.compile`, with torch.optim.AdamW (fused) and clip_grad_norm_, fed batches of
  random tokens already on the GPU (no data loading: the peer's step is a lower bound). Where the peer's whole batch
  does not fit, it accumulates gradients over the largest microbatch that does (halving from the batch on CUDA
  out-of-memory, as Composer's auto microbatching does), so every case trains the same samples per optimizer step.

MFU = tokens/s x FLOPs per token (6N + 12 L d S, the model's own count) / the device's dense bf16 peak, named per
device (H100 SXM and H200: 989 TFLOP/s). Peak memory is the CUDA caching allocator's peak allocation. Prints a
Markdown table and writes results.json / report.md to --out.

    python3 benchmarks/gpu_train_vs_pytorch.py --bench DIR/bench_gpu_train_step [--shapes 125m,350m,1b] [--out DIR]
"""
import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Dense bf16 peak per device (NVIDIA's datasheets; the sparse figure is twice this).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
SHAPES = {  # recipe, microbatch at sequence 2048
    "125m": ("recipes/mpt-125m.yaml", 16),
    "350m": ("recipes/mpt-350m.yaml", 8),
    "1b": ("recipes/mpt-1b.yaml", 8),
}
HF_ARCH = ["model.attn_config.alibi=true", "model.no_bias=true", "model.norm_type=layernorm",
           "model.learned_pos_emb=false"]


def peak_for(name):
    for key, value in PEAK_BF16.items():
        if key in name:
            return value
    return None


def run_tessera(bench, recipe, batch, seq, steps, warmup, overrides):
    cmd = [bench, "--recipe", str(ROOT / recipe), "--batch", str(batch), "--seq", str(seq), "--steps", str(steps),
           "--warmup", str(warmup), "--precision", "amp_bf16", *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def model_shape(recipe):
    import yaml
    m = yaml.safe_load((ROOT / recipe).read_text())["model"]
    return m["d_model"], m["n_heads"], m["n_layers"], m.get("expansion_ratio", 4), m["vocab_size"]


def run_pytorch(recipe, batch, seq, steps, warmup, compile_model):
    """The peer's step at the largest microbatch that fits (batch, batch/2, ... as Composer's auto microbatching
    finds it), accumulating gradients to the same `batch` samples per optimizer step."""
    micro = batch
    while True:
        r = run_pytorch_micro(recipe, batch, micro, seq, steps, warmup, compile_model)
        if r.get("error") != "CUDA out of memory" or micro == 1:
            return r
        micro //= 2


def run_pytorch_micro(recipe, batch, micro, seq, steps, warmup, compile_model):
    import torch
    from transformers import MptConfig, MptForCausalLM
    d, h, layers, ratio, vocab = model_shape(recipe)
    cfg = MptConfig(d_model=d, n_heads=h, n_layers=layers, expansion_ratio=ratio, max_seq_len=seq, vocab_size=vocab,
                    no_bias=True, attn_config={"alibi": True, "attn_impl": "torch"})
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = MptForCausalLM(cfg).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    step_model = torch.compile(model) if compile_model else model
    batches = torch.randint(0, vocab, (steps + warmup, batch, seq), device="cuda")
    ends = []
    try:
        for i in range(steps + warmup):
            for ids in batches[i].split(micro):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = step_model(input_ids=ids, labels=ids).loss * (ids.shape[0] / batch)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()
            ends.append(time.perf_counter())
    except torch.OutOfMemoryError:
        del model, opt, step_model
        batches = None
        torch.cuda.empty_cache()
        return {"error": "CUDA out of memory"}
    seconds = ends[-1] - ends[warmup - 1]
    out = {"params": params, "tokens_per_sec": steps * batch * seq / seconds, "step_ms": seconds * 1e3 / steps,
           "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9, "microbatch": micro}
    del model, opt, step_model, batches
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of bench_gpu_train_step")
    ap.add_argument("--shapes", default="125m,350m,1b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args()
    import torch
    device = torch.cuda.get_device_name(0)
    peak = peak_for(device)
    rows = []
    for shape in args.shapes.split(","):
        recipe, batch = SHAPES[shape]
        cases = {
            "tessera (recipe arch)": lambda: run_tessera(args.bench, recipe, batch, args.seq, args.steps, args.warmup,
                                                         []),
            "tessera (HF arch)": lambda: run_tessera(args.bench, recipe, batch, args.seq, args.steps, args.warmup,
                                                     HF_ARCH),
            "pytorch eager (HF MptForCausalLM)": lambda: run_pytorch(recipe, batch, args.seq, args.steps, args.warmup,
                                                                     False),
        }
        if not args.no_compile:
            cases["pytorch torch.compile (HF MptForCausalLM)"] = lambda: run_pytorch(
                recipe, batch, args.seq, args.steps, args.warmup, True)
        flops = None
        for name, fn in cases.items():
            try:
                r = fn()
            except Exception as e:  # a peer that cannot run here is reported, not fatal
                r = {"error": f"{type(e).__name__}: {e}"[:400]}
            flops = r.get("flops_per_token", flops)
            r.update({"shape": shape, "case": name, "batch": batch, "seq": args.seq})
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
        for r in rows:
            if r["shape"] == shape and "tokens_per_sec" in r:
                # The FLOPs count of the shape (Tessera's model reports it; HF's architecture has the same GEMMs).
                f = r.get("flops_per_token") or flops
                if f and peak:
                    r["mfu"] = r["tokens_per_sec"] * f / peak
    eager = {r["shape"]: r.get("tokens_per_sec") for r in rows if r["case"].startswith("pytorch eager")}
    lines = [f"Device: {device} (bf16 dense peak {peak / 1e12:.0f} TFLOP/s)" if peak else f"Device: {device}", "",
             "| shape | case | batch x seq | microbatch | tokens/s | MFU | step ms | peak alloc GB | vs eager |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "tokens_per_sec" not in r:
            lines.append(f"| {r['shape']} | {r['case']} | {r['batch']} x {r['seq']} | | {r['error']} | | | | |")
            continue
        ratio = r["tokens_per_sec"] / eager[r["shape"]] if eager.get(r["shape"]) else None
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else ""
        lines.append(f"| {r['shape']} | {r['case']} | {r['batch']} x {r['seq']} | {r.get('microbatch', r['batch'])} | "
                     f"{r['tokens_per_sec']:,.0f} | {mfu} | "
                     f"{r['step_ms']:.1f} | {r['peak_allocated_gb']:.1f} | {f'{ratio:.2f}x' if ratio else ''} |")
    report = "\n".join(lines)
    print(report)
    suite_rows = []  # benchmarks/run: per shape, Tessera (recipe arch) with the PyTorch runs as peers
    for shape in args.shapes.split(","):
        by_case = {r["case"]: r for r in rows if r["shape"] == shape}
        ours = by_case.get("tessera (recipe arch)", {})
        suite_rows.append({"case": f"mpt-{shape} amp_bf16 seq {args.seq}", "unit": "tokens/s",
                           "tessera": ours.get("tokens_per_sec"), "mfu": ours.get("mfu"),
                           "peak_allocated_gb": ours.get("peak_allocated_gb"),
                           "peers": {name: r.get("tokens_per_sec") for name, r in by_case.items()
                                     if name != "tessera (recipe arch)"}})
    bench_json.emit("gpu_train_vs_pytorch", suite_rows, device=device, peak_bf16_flops=peak,
                    title=f"Training step on one GPU ({device}): Tessera vs PyTorch")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": device, "peak_bf16_flops": peak, "torch": torch.__version__, "python": platform.python_version(),
                "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
        (args.out / "gpu_benchmarks.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (args.out / "gpu_benchmarks.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
