"""Llama against Hugging Face transformers on CPU, in one run on the same machine:

--part fwd_bwd: forward+backward throughput of Tessera's `llama` (bench_fwd_bwd) against transformers' eager
    LlamaForCausalLM, same shape, batch and sequence, fp32 and bf16 autocast: the tiny CPU recipe's shape and
    Llama 3.2 1B's (recipes/llama3.2-1b.yaml) at a short sequence. HF is measured as it runs by default and with the
    glibc malloc settings Tessera gives itself (util::configure_host_allocator), through the environment; the ratio
    that matters is against the latter ("the same allocator settings").

--part load: peak host memory of loading a sharded Hugging Face folder of a 1B-class model (Llama 3.2 1B's shape,
    random bf16 weights written by transformers' save_pretrained in 500MB shards) into an fp32 model on one process:
    Tessera's load_hf_model (bench_hf_load) against transformers' from_pretrained(torch_dtype=float32). The target
    for Tessera: peak - baseline <= model bytes + the largest stored tensor.

    python benchmarks/llama_vs_hf.py --part fwd_bwd [--rounds 3] [--steps N] [--seq 128] [--shapes tiny,1b]
    python benchmarks/llama_vs_hf.py --part load [--dir DIR]

Medians over --rounds alternating rounds, so a slow spell of a shared machine does not land on one side only.
"""
import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin"))
TUNED_MALLOC = bench_json.TUNED_MALLOC
SHAPES = {"tiny": "llama-tiny-cpu.yaml", "1b": "llama3.2-1b.yaml"}
STEPS = {"tiny": 20, "1b": 2}  # timed steps per measurement when --steps is not given


def hf_config(recipe, seq):
    from transformers import LlamaConfig
    section = yaml.safe_load((ROOT / "recipes" / recipe).read_text())["model"]
    cfg = {k: v for k, v in section.items() if k not in ("name", "init_device")}
    cfg["max_position_embeddings"] = max(seq, int(cfg["max_position_embeddings"])
                                         if str(cfg["max_position_embeddings"]).isdigit() else seq)
    return LlamaConfig(**cfg)


def hf_fwd_bwd_worker(recipe, precision, batch, seq, steps):
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    cfg = hf_config(recipe, seq)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    seconds = bench_json.time_train_steps(model, ids, precision, steps)
    print(json.dumps({"tokens_per_s": batch * seq * steps / seconds}))


def steps_of(shape, args):
    return args.steps or STEPS[shape]


def hf_fwd_bwd(shape, precision, args, tuned):
    env = dict(os.environ, **(TUNED_MALLOC if tuned else {}))
    out = subprocess.run([sys.executable, __file__, "--hf-worker", "fwd_bwd", "--recipe", SHAPES[shape], "--precision",
                          precision, "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
                          str(steps_of(shape, args))],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def tessera_fwd_bwd(shape, precision, args):
    out = subprocess.run([BIN / "bench_fwd_bwd", "--recipe", str(ROOT / "recipes" / SHAPES[shape]), "--precision",
                          precision, "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
                          str(steps_of(shape, args)), f"variables.max_seq_len={args.seq}"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fwd_bwd(args):
    print(f"Llama forward+backward, batch {args.batch} x seq {args.seq}; median of {args.rounds} alternating rounds of "
          f"timed steps ({', '.join(f'{s}: {steps_of(s, args)}' for s in args.shapes.split(','))}) after 1 warm-up "
          "(tokens/s)")
    print(f"{'case':<16}{'Tessera':>10}{'HF eager':>10}{'HF+malloc':>11}{'ratio':>7}{'ratio*':>8}{'MFU T':>8}"
          "   (ratio* = vs HF eager with Tessera's malloc settings)")
    rows = []
    for shape in args.shapes.split(","):
        for precision in ("fp32", "amp_bf16"):
            ours, theirs, tuned = [], [], []
            # On a CPU that emulates bf16, the amp_bf16 case is one short round, marked.
            emulated = precision == "amp_bf16" and bench_json.cpu_bf16_emulated()
            run = argparse.Namespace(**{**vars(args), "steps": bench_json.EMULATED_BF16_STEPS}) if emulated else args
            for _ in range(1 if emulated else args.rounds):
                ours.append(tessera_fwd_bwd(shape, precision, run))
                theirs.append(hf_fwd_bwd(shape, precision, run, tuned=False))
                tuned.append(hf_fwd_bwd(shape, precision, run, tuned=True))
            t = statistics.median(r["tokens_per_s"] for r in ours)
            h, ht = statistics.median(theirs), statistics.median(tuned)
            f = ours[0]["flops_per_token"]
            peak = statistics.median(r["gemm_peak_flops"] for r in ours)
            case = f"llama {shape} {precision}" + (f" ({bench_json.EMULATED_BF16_NOTE})" if emulated else "")
            mfu = None if emulated else t * f / peak
            peer_mfu = {"HF LlamaForCausalLM eager": None if emulated else h * f / peak,
                        "HF eager + malloc settings": None if emulated else ht * f / peak}
            print(f"{case:<16}{t:>10.1f}{h:>10.1f}{ht:>11.1f}{t / h:>7.2f}{t / ht:>8.2f}{bench_json.pct(mfu, 8)}",
                  flush=True)
            rows.append({"case": case, "bf16_emulated": emulated, "unit": "tokens/s", "tessera": t,
                         "peers": {"HF LlamaForCausalLM eager": h, "HF eager + malloc settings": ht},
                         "params": ours[0]["params"], "mfu": mfu, "peer_mfu": peer_mfu,
                         "timed_steps": steps_of(shape, run), "gemm_peak_flops": peak,
                         "batch": args.batch, "seq": args.seq})
    bench_json.emit("llama_fwd_bwd_vs_hf", rows, title="Llama forward + backward (CPU): Tessera vs Hugging Face")


def status_bytes(key):
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1


def hf_load_worker(folder):
    import torch
    from transformers import AutoModelForCausalLM
    before = status_bytes("VmRSS")
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    seconds = time.perf_counter() - t0
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"seconds": seconds, "rss_before": before, "peak_rss": status_bytes("VmHWM"),
                      "model_bytes": model_bytes, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def write_folder(folder):
    import torch
    from transformers import LlamaForCausalLM
    from transformers.modeling_utils import no_init_weights
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with no_init_weights():
        model = LlamaForCausalLM(hf_config(SHAPES["1b"], 128))
    model.tie_weights()  # Llama 3.2 1B ties lm_head to the embedding (no_init_weights skips the tying too)
    # Random values for a load benchmark (what they are does not change a load's work): one block of 2^24 normal
    # values repeated through every tensor, a copy where normal_ over 1.2B bf16 values takes ~26 s on two cores.
    block = torch.randn(1 << 24) * 0.02
    with torch.no_grad():
        for p in model.parameters():
            flat = p.view(-1)
            for at in range(0, flat.numel(), block.numel()):
                n = min(block.numel(), flat.numel() - at)
                flat[at:at + n].copy_(block[:n])
    model.save_pretrained(folder, max_shard_size="500MB", safe_serialization=True)


def load(args):
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = pathlib.Path(tmp) / "llama-1b"
        subprocess.run([sys.executable, __file__, "--hf-worker", "write", "--folder", str(folder)], check=True)
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
        ours = json.loads(subprocess.run([BIN / "bench_hf_load", "--folder", str(folder)], capture_output=True,
                                         text=True, check=True).stdout.strip().splitlines()[-1])
        theirs = json.loads(subprocess.run([sys.executable, __file__, "--hf-worker", "load", "--folder", str(folder)],
                                           capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    gib = 2**30
    target = ours["model_bytes"] + ours["largest_stored_bytes"]
    t_used, h_used = ours["peak_rss"] - ours["rss_before"], theirs["peak_rss"] - theirs["rss_before"]
    print(f"Llama 3.2 1B shape: {len(shards)} shards of bf16 ({ours['stored_bytes'] / gib:.2f} GiB stored, largest "
          f"tensor {ours['largest_stored_bytes'] / gib:.2f} GiB), loaded into fp32 ({ours['model_bytes'] / gib:.2f} "
          "GiB)")
    print(f"{'':<14}{'seconds':>9}{'peak - baseline':>17}{'/ model':>9}{'target':>9}")
    print(f"{'Tessera':<14}{ours['seconds']:>9.1f}{t_used / gib:>13.2f} GiB{t_used / ours['model_bytes']:>9.2f}"
          f"{target / gib:>5.2f} GiB  {'met' if t_used <= target else 'MISSED'}")
    print(f"{'HF':<14}{theirs['seconds']:>9.1f}{h_used / gib:>13.2f} GiB{h_used / theirs['model_bytes']:>9.2f}")
    rows = [{"case": "load 1B bf16 shards -> fp32", "unit": "GiB/s", "tessera": ours["stored_bytes"] / gib /
             ours["seconds"], "peers": {"HF from_pretrained": ours["stored_bytes"] / gib / theirs["seconds"]},
             "tessera_peak_minus_baseline_gib": t_used / gib, "hf_peak_minus_baseline_gib": h_used / gib,
             "model_gib": ours["model_bytes"] / gib, "largest_stored_gib": ours["largest_stored_bytes"] / gib,
             "target_gib": target / gib, "target_met": t_used <= target, "shards": len(shards)}]
    bench_json.emit("hf_load_memory", rows, title="Loading a sharded 1B Hugging Face folder (CPU): peak memory")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["fwd_bwd", "load"], default="fwd_bwd")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 20 tiny, 2 for 1b)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--shapes", default="tiny,1b")
    ap.add_argument("--dir", default=None, help="where the 1B folder is written (default: the system temp folder)")
    ap.add_argument("--hf-worker", choices=["fwd_bwd", "load", "write"])
    ap.add_argument("--recipe")
    ap.add_argument("--precision", choices=["fp32", "amp_bf16"])
    ap.add_argument("--folder")
    args = ap.parse_args()
    if args.hf_worker == "fwd_bwd":
        hf_fwd_bwd_worker(args.recipe, args.precision, args.batch, args.seq, args.steps)
    elif args.hf_worker == "load":
        hf_load_worker(args.folder)
    elif args.hf_worker == "write":
        write_folder(args.folder)
    elif args.part == "load":
        load(args)
    else:
        fwd_bwd(args)


if __name__ == "__main__":
    main()
