"""MPT forward+backward throughput: Tessera (C++) against Hugging Face transformers' eager MptForCausalLM (PyTorch), in
one run on the same machine, same model shape, batch and sequence length, fp32 and bf16 autocast.

The model is mpt-125m's shape (d_model 768, 12 heads, 12 layers, vocab 50368) in the variant HF's class implements
(ALiBi, no biases), at sequence length 512. MFU = tokens/s x FLOPs/token (6N + 12 L d S) / measured GEMM peak.

Tessera configures glibc malloc for training loops (util::configure_host_allocator: no mmap for large blocks, high
trim threshold). HF is measured twice: as it runs by default, and with the same glibc settings given through the
environment (MALLOC_MMAP_MAX_=0 ...), so the table separates the allocator's share of the difference.

    python benchmarks/mpt_fwd_bwd_vs_hf.py [--rounds 3] [--steps 3] [--batch 1] [--seq 512]

The three measurements alternate for --rounds rounds (each builds the model, warms up one step, times --steps steps)
and medians are reported, so that a slow spell of a shared machine does not land on one side only.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = os.environ.get("TESSERA_BENCH_BIN", str(ROOT / "build" / "bin" / "bench_fwd_bwd"))
TUNED_MALLOC = bench_json.TUNED_MALLOC


def hf_worker(precision, batch, seq, steps, warmup=1):
    import torch
    from transformers import MptConfig, MptForCausalLM
    torch.manual_seed(0)
    cfg = MptConfig(d_model=768, n_heads=12, n_layers=12, expansion_ratio=4, max_seq_len=seq, vocab_size=50368)
    model = MptForCausalLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    seconds = bench_json.time_train_steps(model, ids, precision, steps, warmup)
    print(json.dumps({"tokens_per_s": batch * seq * steps / seconds, "threads": torch.get_num_threads(),
                      "torch": torch.__version__}))


def hf(precision, args, tuned):
    env = dict(os.environ, **(TUNED_MALLOC if tuned else {}))
    out = subprocess.run([sys.executable, __file__, "--hf-worker", precision, "--batch", str(args.batch),
                          "--seq", str(args.seq), "--steps", str(args.steps)],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tessera(precision, args):
    out = subprocess.run([BENCH, "--recipe", str(ROOT / "recipes" / "mpt-125m.yaml"), "--precision", precision,
                          "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
                          f"variables.max_seq_len={args.seq}", "model.no_bias=true", "model.attn_config.alibi=true"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hf-worker", choices=["fp32", "amp_bf16"])
    args = ap.parse_args()
    if args.hf_worker:
        hf_worker(args.hf_worker, args.batch, args.seq, args.steps)
        return
    print(f"mpt-125m shape (ALiBi, no bias), batch {args.batch} x seq {args.seq}; median of {args.rounds} "
          f"alternating rounds of {args.steps} timed steps after 1 warm-up")
    print(f"{'precision':<10}{'Tessera':>9}{'HF':>9}{'HF+malloc':>11}{'ratio':>7}{'ratio*':>8}"
          f"{'MFU T':>8}{'MFU HF':>8}{'MFU HF+':>9}{'GEMM peak':>12}   (tokens/s; ratio* = vs HF+malloc)")
    rows = []
    for precision in ("fp32", "amp_bf16"):
        ours, theirs, tuned = [], [], []
        # On a CPU that emulates bf16, the amp_bf16 case is one short round, marked.
        emulated = precision == "amp_bf16" and bench_json.cpu_bf16_emulated()
        run = argparse.Namespace(**{**vars(args), "steps": bench_json.EMULATED_BF16_STEPS}) if emulated else args
        for _ in range(1 if emulated else args.rounds):
            ours.append(tessera(precision, run))
            theirs.append(hf(precision, run, tuned=False)["tokens_per_s"])
            tuned.append(hf(precision, run, tuned=True)["tokens_per_s"])
        t, h, ht = (statistics.median(x) for x in ([r["tokens_per_s"] for r in ours], theirs, tuned))
        f = ours[0]["flops_per_token"]
        peak = statistics.median(r["gemm_peak_flops"] for r in ours)
        mfu = [None if emulated else x * f / peak for x in (t, h, ht)]
        print(f"{precision:<10}{t:>9.1f}{h:>9.1f}{ht:>11.1f}{t / h:>7.2f}{t / ht:>8.2f}{bench_json.pct(mfu[0], 8)}"
              f"{bench_json.pct(mfu[1], 8)}{bench_json.pct(mfu[2], 9)}{peak / 1e9:>8.0f} GF/s", flush=True)
        if emulated:
            print(f"  (amp_bf16: {bench_json.EMULATED_BF16_NOTE})", flush=True)
        label = f"mpt-125m {precision}" + (f" ({bench_json.EMULATED_BF16_NOTE})" if emulated else "")
        rows.append({"case": label, "bf16_emulated": emulated, "unit": "tokens/s", "tessera": t,
                     "peers": {"HF MptForCausalLM eager": h, "HF eager + malloc settings": ht},
                     "mfu": mfu[0], "peer_mfu": {"HF MptForCausalLM eager": mfu[1], "HF eager + malloc settings": mfu[2]},
                     "timed_steps": run.steps, "gemm_peak_flops": peak, "batch": args.batch, "seq": args.seq})
    bench_json.emit("mpt_fwd_bwd_vs_hf", rows, title="MPT forward + backward (CPU): Tessera vs Hugging Face")


if __name__ == "__main__":
    main()
