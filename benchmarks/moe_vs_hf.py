"""A Mixtral-shaped mixture of experts against Hugging Face transformers on CPU, in one run on the same machine: the
forward + backward + loss step of Tessera's `llama` with model_type mixtral (bench_fwd_bwd over
recipes/mixtral-8x7b.yaml shrunk: 8 experts, 2 per token, with the load-balancing loss) against transformers' eager
MixtralForCausalLM of the same shape, batch and sequence, fp32 and bf16 autocast. HF is measured as it runs and with
the glibc malloc settings Tessera gives itself; the ratio that matters is against the latter.

Both sides route the same way (softmax top 2, weights renormalised) and loop over experts, not tokens; Tessera sorts
the (token, slot) pairs by expert once per layer and runs each expert's GEMMs over contiguous rows, transformers
gathers each expert's tokens with torch.where.

    python benchmarks/moe_vs_hf.py [--rounds 3] [--steps 5] [--batch 2] [--seq 256] [--hidden 512]

Medians over --rounds alternating rounds, so a slow spell of a shared machine does not land on one side only.
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
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin"))
RECIPE = ROOT / "recipes" / "mixtral-8x7b.yaml"


def shape(args):
    """The shrunk Mixtral: 8 experts, top 2, heads of 64, 4 key/value heads, Mixtral's vocabulary."""
    return dict(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                num_attention_heads=args.hidden // 64, num_key_value_heads=4, vocab_size=32000,
                num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=max(args.seq, 256),
                output_router_logits=True, router_aux_loss_coef=0.02, rope_theta=1e6, rms_norm_eps=1e-5,
                tie_word_embeddings=False)


def hf_worker(args, precision):
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    cfg = MixtralConfig(**shape(args))
    cfg._attn_implementation = "eager"
    model = MixtralForCausalLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
    seconds = bench_json.time_train_steps(model, ids, precision, args.steps)
    print(json.dumps({"tokens_per_s": args.batch * args.seq * args.steps / seconds}))


def hf(args, precision, tuned):
    env = dict(os.environ, **(bench_json.TUNED_MALLOC if tuned else {}))
    cmd = [sys.executable, __file__, "--hf-worker", precision, "--batch", str(args.batch), "--seq", str(args.seq),
           "--steps", str(args.steps), "--hidden", str(args.hidden), "--layers", str(args.layers)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def tessera(args, precision):
    overrides = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in shape(args).items()]
    out = subprocess.run([BIN / "bench_fwd_bwd", "--recipe", str(RECIPE), "--precision", precision, "--batch",
                          str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
                          f"variables.max_seq_len={args.seq}", "model.init_device=cpu", *overrides],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hf-worker", choices=["fp32", "amp_bf16"])
    args = ap.parse_args()
    if args.hf_worker:
        hf_worker(args, args.hf_worker)
        return
    print(f"Mixtral-shaped MoE (hidden {args.hidden}, {args.layers} layers, 8 experts of {2 * args.hidden}, top 2) "
          f"forward+backward, batch {args.batch} x seq {args.seq}; median of {args.rounds} alternating rounds of "
          f"{args.steps} timed steps after 1 warm-up (tokens/s)")
    print(f"{'case':<22}{'Tessera':>10}{'HF eager':>10}{'HF+malloc':>11}{'ratio':>7}{'ratio*':>8}{'MFU T':>8}"
          "   (ratio* = vs HF eager with Tessera's malloc settings)")
    rows = []
    for precision in ("fp32", "amp_bf16"):
        emulated = precision == "amp_bf16" and bench_json.cpu_bf16_emulated()
        run = argparse.Namespace(**{**vars(args), "steps": bench_json.EMULATED_BF16_STEPS}) if emulated else args
        ours, theirs, tuned = [], [], []
        for _ in range(1 if emulated else args.rounds):
            ours.append(tessera(run, precision))
            theirs.append(hf(run, precision, tuned=False))
            tuned.append(hf(run, precision, tuned=True))
        t = statistics.median(r["tokens_per_s"] for r in ours)
        h, ht = statistics.median(theirs), statistics.median(tuned)
        peak = statistics.median(r["gemm_peak_flops"] for r in ours)
        f = ours[0]["flops_per_token"]  # from the active parameters
        case = f"mixtral-small {precision}" + (f" ({bench_json.EMULATED_BF16_NOTE})" if emulated else "")
        mfu = None if emulated else t * f / peak
        peer_mfu = {"HF MixtralForCausalLM eager": None if emulated else h * f / peak,
                    "HF eager + malloc settings": None if emulated else ht * f / peak}
        print(f"{case:<22}{t:>10.1f}{h:>10.1f}{ht:>11.1f}{t / h:>7.2f}{t / ht:>8.2f}{bench_json.pct(mfu, 8)}",
              flush=True)
        rows.append({"case": case, "bf16_emulated": emulated, "unit": "tokens/s", "tessera": t,
                     "peers": {"HF MixtralForCausalLM eager": h, "HF eager + malloc settings": ht},
                     "params": ours[0]["params"], "mfu": mfu, "peer_mfu": peer_mfu, "timed_steps": run.steps,
                     "gemm_peak_flops": peak, "batch": args.batch,
                     "seq": args.seq})
    bench_json.emit("moe_fwd_bwd_vs_hf", rows,
                    title="Mixture of experts forward + backward (CPU): Tessera vs Hugging Face Mixtral")


if __name__ == "__main__":
    main()
