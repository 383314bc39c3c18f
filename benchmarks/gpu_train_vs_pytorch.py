"""One GPU: Tessera's training step against the same step in plain PyTorch and in torchtitan, in one run on the same GPU.

Shapes (sequence 2048, amp_bf16: bf16 autocast of forward and loss, fp32 weights and AdamW state, gradient clipping
at norm 1.0, the same samples per optimizer step in every case):

- `125m`, `350m`, `1b`: recipes/mpt-{125m,350m,1b}.yaml.
  Tessera twice: the recipe's architecture (learned positions, biases; SDPA flash attention) and the architecture
  HF's class implements (ALiBi, no biases, plain LayerNorm); Hugging Face's `MptForCausalLM` on that second one,
  eager and under `torch.compile`.
- `llama1b`: recipes/llama3.2-1b.yaml (Llama 3.2 1B: tied embeddings, GQA 32/8, SwiGLU 8192, vocab 128256).
  Tessera on it, and with untied embeddings (the shape torchtitan 0.2.2's Llama 3 builds, which cannot tie them);
  HF `LlamaForCausalLM` (SDPA attention) eager and compiled; torchtitan's own trainer (`torchtitan.train`, its Llama 3
  model, FSDP2 wrapping on one GPU, fused AdamW), eager and with its `--compile.enable` (per block), on random tokens
  (benchmarks/torchtitan_llama.py).
- `--fp8`: Tessera's amp_fp8 (float8 Linear GEMMs) on the 1b and llama1b shapes beside its amp_bf16.
- `--graph-shapes` (default 125m): Tessera with `cuda_graphs: true`, each step's forward and backward replayed as one
  captured CUDA graph (the optimizer and clipping eager after it).

Tessera runs `bench_gpu_train_step` (the whole step as `train` runs it: MDS data loading, forward, backward,
clipping, AdamW). The peers are fed random tokens already on the GPU (no data loading: a lower bound on their step).
Where a peer's whole batch does not fit it accumulates over the largest microbatch that does (halving on CUDA
out-of-memory, as Composer's auto microbatching does). Every case runs in its own process under --case-timeout, so a
compile that takes too long costs only its own row.

MFU = tokens/s x FLOPs per token (6N + 12 L d S, Tessera's model count for the shape; for llama1b the tied model's)
/ the device's dense bf16 peak (H100 SXM and H200: 989 TFLOP/s), for amp_fp8 too. Peak memory: the CUDA caching
allocator's peak allocation (torchtitan: its peak active memory). With --profile DIR, each shape's first Tessera case
also writes a Kineto trace of two more steps, split by benchmarks/gpu_profile.py into the report.

    python3 benchmarks/gpu_train_vs_pytorch.py --bench DIR/bench_gpu_train_step [--shapes 125m,1b,llama1b]
        [--compile-shapes 125m,llama1b] [--fp8] [--graph-shapes 125m] [--titan-site DIR] [--profile DIR] [--out DIR]
"""
import argparse
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent
# Dense bf16 peak per device (NVIDIA's datasheets; the sparse figure is twice this).
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
SHAPES = {  # family, recipe, samples per step at sequence 2048
    "125m": ("mpt", "recipes/mpt-125m.yaml", 16),
    "350m": ("mpt", "recipes/mpt-350m.yaml", 8),
    "1b": ("mpt", "recipes/mpt-1b.yaml", 8),
    "llama1b": ("llama", "recipes/llama3.2-1b.yaml", 8),
}
HF_ARCH = ["model.attn_config.alibi=true", "model.no_bias=true", "model.norm_type=layernorm",
           "model.learned_pos_emb=false"]
FP8_SHAPES = ("1b", "llama1b")


def peak_for(name):
    for key, value in PEAK_BF16.items():
        if key in name:
            return value
    return None


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return None


def run_process(cmd, timeout, env=None):
    """The last JSON line `cmd` prints, or {"error": ...}. In a session of its own: a case past `timeout` is ended
    with everything it started (torchrun's workers too), so that it does not share the GPU with the next case."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"error": f"did not finish within {timeout} s"}, ""
    out = last_json(stdout) if p.returncode == 0 else None
    if out is None:
        return {"error": (stderr or stdout).strip()[-400:] or f"exit {p.returncode}"}, stdout + stderr
    return out, stdout + stderr


def run_tessera(args, recipe, batch, overrides, precision="amp_bf16", profile=None):
    cmd = [args.bench, "--recipe", str(ROOT / recipe), "--batch", str(batch), "--seq", str(args.seq), "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--precision", precision, *overrides]
    if profile:
        cmd += ["--profile", str(profile), "--profile-steps", "2"]
    r, _ = run_process(cmd, args.case_timeout)
    return r


def run_peer(args, peer, shape, compile_model):
    """A peer case in its own process: `--peer hf|titan` of this script."""
    cmd = [sys.executable, __file__, "--peer", peer, "--shapes", shape, "--seq", str(args.seq), "--steps",
           str(args.steps), "--warmup", str(args.warmup)] + (["--compile"] if compile_model else [])
    if peer == "titan":
        if not args.titan_site:
            return {"error": "torchtitan not given (--titan-site: the kit's wheels, unpacked)"}
        cmd += ["--titan-site", args.titan_site]
    r, _ = run_process(cmd, args.case_timeout)
    return r


# ---- The peers, each in its own process --------------------------------------------------------------------------

def recipe_model(recipe):
    import yaml
    return yaml.safe_load((ROOT / recipe).read_text())["model"]


def hf_model(family, recipe, seq):
    from transformers import LlamaConfig, LlamaForCausalLM, MptConfig, MptForCausalLM
    m = recipe_model(recipe)
    if family == "mpt":
        cfg = MptConfig(d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                        expansion_ratio=m.get("expansion_ratio", 4), max_seq_len=seq, vocab_size=m["vocab_size"],
                        no_bias=True, attn_config={"alibi": True, "attn_impl": "torch"})
        return MptForCausalLM(cfg), m["vocab_size"]
    cfg = LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
                      intermediate_size=m["intermediate_size"], num_hidden_layers=m["num_hidden_layers"],
                      num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_key_value_heads"],
                      head_dim=m.get("head_dim"), max_position_embeddings=m["max_position_embeddings"],
                      rms_norm_eps=m["rms_norm_eps"], rope_theta=m["rope_theta"], rope_scaling=m.get("rope_scaling"),
                      tie_word_embeddings=m.get("tie_word_embeddings", False), attn_implementation="sdpa")
    return LlamaForCausalLM(cfg), m["vocab_size"]


def hf_case(args):
    """HF's class at the largest microbatch that fits (batch, batch/2, ...), accumulating to the same batch."""
    family, recipe, batch = SHAPES[args.shapes]
    micro = batch
    while True:
        r = hf_micro(family, recipe, batch, micro, args.seq, args.steps, args.warmup, args.compile)
        if r.get("error") != "CUDA out of memory" or micro == 1:
            return r
        micro //= 2


def hf_micro(family, recipe, batch, micro, seq, steps, warmup, compile_model):
    import torch
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, vocab = hf_model(family, recipe, seq)
    model = model.cuda()
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


def titan_case(args):
    """torchtitan's trainer through torchrun (one process), its per-step metrics read from the driver's lines."""
    _, _, batch = SHAPES[args.shapes]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [args.titan_site, os.environ.get("PYTHONPATH")])))
    dump = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"tessera_titan_{os.getpid()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           str(HERE / "torchtitan_llama.py"), "--model.name", "llama3_synth", "--model.flavor", "1B",
           "--training.local_batch_size", str(batch), "--training.seq_len", str(args.seq),
           "--training.steps", str(args.steps + args.warmup), "--optimizer.lr", "6e-4", "--optimizer.eps", "1e-8",
           "--optimizer.weight_decay", "0.0", "--lr_scheduler.warmup_steps", "2", "--training.max_norm", "1.0",
           "--activation_checkpoint.mode", "none", "--metrics.log_freq", "1", "--metrics.disable_color_printing",
           "--job.dump_folder", str(dump), "--compile.enable" if args.compile else "--compile.no-enable"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    steps = [json.loads(line[len("TT_METRICS "):]) for line in p.stdout.splitlines() if line.startswith("TT_METRICS ")]
    if p.returncode != 0 or len(steps) < args.steps + args.warmup:
        return {"error": (p.stderr or p.stdout).strip()[-400:] or f"exit {p.returncode}"}
    timed = [s for s in steps if s["step"] > args.warmup]

    def field(row, *names):
        for key, value in row.items():
            if all(n in key for n in names):
                return value
        return None
    tps = [field(s, "tps") for s in timed]
    if None in tps:
        return {"error": f"no tokens/s in torchtitan's metrics: {sorted(timed[0])}"}
    mean_tps = sum(tps) / len(tps)
    active = [field(s, "max_active", "GiB") or 0.0 for s in timed]
    return {"tokens_per_sec": mean_tps, "step_ms": batch * args.seq / mean_tps * 1e3,
            "peak_allocated_gb": max(active) * 2**30 / 1e9, "microbatch": batch,
            "titan_mfu": sum(field(s, "mfu") or 0.0 for s in timed) / len(timed) / 100}


# ---- The run -----------------------------------------------------------------------------------------------------

def cases_for(args, shape):
    family, recipe, batch = SHAPES[shape]
    compile_here = shape in args.compile_shapes.split(",")
    profile = pathlib.Path(args.profile) / f"profile-{shape}.json" if args.profile else None
    cases = {"tessera": lambda: run_tessera(args, recipe, batch, [], profile=profile)}
    if family == "mpt":
        cases["tessera (HF arch)"] = lambda: run_tessera(args, recipe, batch, HF_ARCH)
    else:
        cases["tessera (untied, torchtitan's shape)"] = lambda: run_tessera(args, recipe, batch,
                                                                          ["model.tie_word_embeddings=false"])
    if args.fp8 and shape in FP8_SHAPES:
        cases["tessera amp_fp8"] = lambda: run_tessera(args, recipe, batch, [], precision="amp_fp8")
    if shape in args.graph_shapes.split(","):
        cases["tessera cuda_graphs"] = lambda: run_tessera(args, recipe, batch, ["--cuda-graphs"])
    # The eager peers before the compiled ones: under --budget-s the slowest cases are the ones left out.
    hf = "HF MptForCausalLM" if family == "mpt" else "HF LlamaForCausalLM"
    cases[f"pytorch eager ({hf})"] = lambda: run_peer(args, "hf", shape, False)
    if family == "llama":
        cases["torchtitan eager"] = lambda: run_peer(args, "titan", shape, False)
    if compile_here:
        cases[f"pytorch torch.compile ({hf})"] = lambda: run_peer(args, "hf", shape, True)
        if family == "llama":
            cases["torchtitan compile"] = lambda: run_peer(args, "titan", shape, True)
    return cases, batch, profile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", help="path of bench_gpu_train_step")
    ap.add_argument("--shapes", default="125m,1b,llama1b")
    ap.add_argument("--compile-shapes", default="125m,llama1b", help="shapes whose peers also run compiled")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--fp8", action="store_true", help="Tessera's amp_fp8 on the 1b and llama1b shapes")
    ap.add_argument("--graph-shapes", default="125m",
                    help="shapes with a case of Tessera's step as one CUDA graph (cuda_graphs: true)")
    ap.add_argument("--titan-site", default=None, help="a folder holding torchtitan and its pure-Python dependencies")
    ap.add_argument("--profile", default=None, help="write Kineto traces of Tessera's steps here and split them")
    ap.add_argument("--case-timeout", type=int, default=240)
    ap.add_argument("--budget-s", type=int, default=0,
                    help="start no case after this many seconds of the run (0: no limit); the rest are reported")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    ap.add_argument("--peer", choices=["hf", "titan"], help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:  # one peer case, in this process
        print(json.dumps(hf_case(args) if args.peer == "hf" else titan_case(args)))
        return
    if not args.bench:
        ap.error("--bench is required")
    if args.no_compile:
        args.compile_shapes = ""
    if args.profile:
        pathlib.Path(args.profile).mkdir(parents=True, exist_ok=True)
    import torch
    device = torch.cuda.get_device_name(0)
    peak = peak_for(device)
    rows, profiles = [], {}
    run_started = time.time()
    for shape in args.shapes.split(","):
        cases, batch, profile = cases_for(args, shape)
        for name, fn in cases.items():
            started = time.time()
            if args.budget_s and started - run_started > args.budget_s:
                r = {"error": f"not run: past the run's time budget (--budget-s {args.budget_s})"}
            else:
                try:
                    r = fn()
                except Exception as e:  # a case that cannot run here is reported, not fatal
                    r = {"error": f"{type(e).__name__}: {e}"[:400]}
            r.update({"shape": shape, "case": name, "batch": batch, "seq": args.seq,
                      "wall_s": round(time.time() - started, 1)})
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
        # One FLOPs count per shape: Tessera's model's (HF's and torchtitan's architectures have the same GEMMs).
        flops = next((r.get("flops_per_token") for r in rows if r["shape"] == shape and r["case"] == "tessera"), None)
        for r in rows:
            if r["shape"] == shape and "tokens_per_sec" in r and flops and peak:
                r["mfu"] = r["tokens_per_sec"] * flops / peak
        if profile and profile.exists():
            import gpu_profile
            with open(profile) as f:
                profiles[shape] = gpu_profile.split(json.load(f))
    eager = {r["shape"]: r.get("tokens_per_sec") for r in rows if r["case"].startswith("pytorch eager")}
    lines = [f"Device: {device} (bf16 dense peak {peak / 1e12:.0f} TFLOP/s)" if peak else f"Device: {device}", "",
             "| shape | case | batch x seq | microbatch | tokens/s | MFU | step ms | peak alloc GB | vs HF eager |",
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
    for shape, p in profiles.items():
        if p:
            import gpu_profile
            lines += ["", f"Where Tessera's {shape} step goes (2 profiled steps):", "", gpu_profile.table(p, 2)]
    report = "\n".join(lines)
    print(report)
    suite_rows = []  # benchmarks/run: per shape, Tessera with every other case as a peer
    for shape in args.shapes.split(","):
        by_case = {r["case"]: r for r in rows if r["shape"] == shape}
        ours = by_case.get("tessera", {})
        suite_rows.append({"case": f"{shape} amp_bf16 seq {args.seq}", "unit": "tokens/s",
                           "tessera": ours.get("tokens_per_sec"), "mfu": ours.get("mfu"),
                           "peak_allocated_gb": ours.get("peak_allocated_gb"),
                           "peers": {name: r.get("tokens_per_sec") for name, r in by_case.items() if name != "tessera"}})
    bench_json.emit("gpu_train_vs_pytorch", suite_rows, device=device, peak_bf16_flops=peak,
                    title=f"Training step on one GPU ({device}): Tessera vs PyTorch and torchtitan")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": device, "peak_bf16_flops": peak, "torch": torch.__version__, "python": platform.python_version(),
                "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
        (args.out / "gpu_benchmarks.json").write_text(
            json.dumps({"meta": meta, "rows": rows, "profiles": profiles}, indent=1))
        (args.out / "gpu_benchmarks.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
