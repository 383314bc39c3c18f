"""End-to-end training throughput: Tessera's `train` against the same training loop written in plain PyTorch, in one
run on the same machine.

Both sides train the same MPT shape from the same MDS files (synthetic random tokens written here with Streaming's
MDSWriter), same batch, sequence length, optimizer (decoupled AdamW: Composer's decay wd * lr_t / lr0 is
torch.optim.AdamW with weight_decay wd / lr0; wd is 0 here, as in the recipes), gradient clipping (global L2 norm 1.0),
precision (fp32, or bf16 autocast of forward and loss) and no gradient accumulation:

- Tessera: `build/bin/train` on a generated recipe; tokens/s is its speed_monitor's throughput/tokens_per_sec over the
  timed batches (warm-up batches excluded; data loading included, process start-up and model construction not),
  read from the jsonl log, as is the GEMM peak (flops_per_sec / mfu: speed_monitor's 1024^2 GEMM probe in the run's
  precision, measured in the same process).
- PyTorch: Hugging Face's eager `MptForCausalLM` (the model class people train MPT with in plain PyTorch), fed by
  mosaicml-streaming's StreamingDataset + torch DataLoader (1 worker, as Tessera's 1 loader thread), the loop
  zero_grad / autocast forward+loss / backward / clip_grad_norm_ / step / loss.item(), timed over the same batches.
  Measured twice: as it runs by default, and with the glibc malloc settings Tessera's train applies to itself
  (util::configure_host_allocator) given through the environment.

- Composer + LLM Foundry (when installed: tools/setup_composer.sh makes ~/.cache/tessera/venv-composer, since they
  pin another torch; or TESSERA_COMPOSER_PYTHON): LLM Foundry's ComposerMPTCausalLM (attn_impl torch,
  torch_crossentropy, no train metrics) in Composer's Trainer on CPU with DecoupledAdamW, GradientClipping and a
  StreamingDataset loader (1 worker), timed from the end of the last warm-up batch to the end of the last batch.
  Composer trains on CPU in fp32 only (it refuses amp precisions there), so its amp_bf16 cells are empty. Its
  speedup is against its own torch, so the column compares frameworks as each installs, not loops on one torch.

HF's class implements only ALiBi without biases, so Tessera runs with model.attn_config.alibi=true, model.no_bias=true
and model.norm_type=layernorm. Cases: the tiny recipe's shape (recipes/mpt-tiny-cpu.yaml: d 256, 4 heads, 4 layers,
vocab 8192) at seq 128, batch 32; mpt-125m's shape (d 768, 12 heads, 12 layers, vocab 50368) at seq 512, batch 1.
MFU = tokens/s x FLOPs/token (6N + 12 L d S) / GEMM peak. Rounds alternate the three measurements and each round's
figures are printed (stderr); the table gives median tokens/s and, as ratios, the median of the per-round ratios
(each compares measurements taken minutes apart, so a slow spell of this shared VM hits both sides of a ratio).

    python benchmarks/train_vs_pytorch.py [--rounds 3] [--cases tiny,125m] [--precisions fp32,amp_bf16]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))
COMPOSER_PYTHON = os.environ.get("TESSERA_COMPOSER_PYTHON",
                                 str(pathlib.Path.home() / ".cache" / "tessera" / "venv-composer" / "bin" / "python"))
TUNED_MALLOC = bench_json.TUNED_MALLOC
LR = 2e-3

# name -> model shape, sequence length, batch, warm-up and timed batches
CASES = {
    "tiny": dict(d_model=256, n_heads=4, n_layers=4, vocab=8192, seq=128, batch=32, warmup=3, steps=20),
    "125m": dict(d_model=768, n_heads=12, n_layers=12, vocab=50368, seq=512, batch=1, warmup=1, steps=3),
}

RECIPE = """
max_seq_len: {seq}
run_name: bench
seed: 17
model:
  name: mpt_causal_lm
  d_model: {d_model}
  n_heads: {n_heads}
  n_layers: {n_layers}
  expansion_ratio: 4
  max_seq_len: {seq}
  vocab_size: {vocab}
  no_bias: true
  norm_type: layernorm
  attn_config: {{attn_impl: torch, alibi: true}}
tokenizer: {{name: unused}}
train_loader:
  name: text
  dataset: {{local: {data}, split: train, shuffle: true, shuffle_seed: 17, max_seq_len: {seq}}}
  drop_last: true
  num_workers: 1
optimizer: {{name: decoupled_adamw, lr: {lr}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.0}}
scheduler: {{name: constant_with_warmup, t_warmup: 0ba}}
algorithms:
  gradient_clipping: {{clipping_type: norm, clipping_threshold: 1.0}}
callbacks:
  speed_monitor: {{window_size: {steps}}}
loggers:
  jsonl: {{filename: {log}}}
max_duration: {total}ba
eval_interval: 0
global_train_batch_size: {batch}
device_train_microbatch_size: {batch}
device_eval_batch_size: {batch}
precision: {precision}
log_to_console: false
"""


STEPS = {}  # --steps / --warmup, when given: the same for every case and framework


def step_args():
    """--steps / --warmup as given, for a worker process."""
    return [a for k, v in STEPS.items() for a in (f"--{k}", str(v))]


def case_for(name, precision):
    """The case's shape and step counts; on a CPU that emulates bf16, its amp_bf16 run is a few steps only (marked in
    the table and the JSON row)."""
    case = dict(CASES[name], **STEPS)
    if precision == "amp_bf16" and bench_json.cpu_bf16_emulated():
        case.update(warmup=1, steps=bench_json.EMULATED_BF16_STEPS)
    return case


def write_data(root, case):
    from streaming import MDSWriter
    import numpy as np
    rng = np.random.default_rng(0)
    n = (case["warmup"] + case["steps"]) * case["batch"]
    with MDSWriter(out=str(root / "train"), columns={"tokens": "ndarray:int32"}) as w:
        for _ in range(n):
            w.write({"tokens": rng.integers(0, case["vocab"], case["seq"], dtype=np.int32)})


def tessera(case, precision, work):
    log = work / f"tessera-{precision}.jsonl"
    log.unlink(missing_ok=True)
    recipe = work / f"recipe-{precision}.yaml"
    recipe.write_text(RECIPE.format(data=work / "data", lr=LR, log=log, precision=precision,
                                    total=case["warmup"] + case["steps"], **case))
    proc = subprocess.run([TRAIN, "--recipe", str(recipe)], cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{TRAIN} --recipe {recipe} failed:\n{proc.stderr}")
    last = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "throughput/tokens_per_sec" in record:
            last = record
    tps = last["throughput/tokens_per_sec"]
    return {"tokens_per_s": tps, "flops_per_token": last["throughput/flops_per_sec"] / tps,
            "gemm_peak": last["throughput/flops_per_sec"] / last["throughput/device/mfu"]}


def pytorch_worker(case, precision, data):
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from transformers import MptConfig, MptForCausalLM
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # as Tessera's train (its default: the cores it may use)
    clean_stale_shared_memory()
    torch.manual_seed(17)
    cfg = MptConfig(d_model=case["d_model"], n_heads=case["n_heads"], n_layers=case["n_layers"], expansion_ratio=4,
                    max_seq_len=case["seq"], vocab_size=case["vocab"])
    model = MptForCausalLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ds = StreamingDataset(local=str(data), split="train", shuffle=True, shuffle_seed=17, batch_size=case["batch"])
    loader = torch.utils.data.DataLoader(ds, batch_size=case["batch"], num_workers=1, drop_last=True)
    it = iter(loader)

    def step():
        ids = next(it)["tokens"][:, :case["seq"]].long()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp_bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(case["warmup"]):
        step()
    t0 = time.perf_counter()
    for _ in range(case["steps"]):
        step()
    elapsed = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": case["batch"] * case["seq"] * case["steps"] / elapsed,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


def composer_worker(case, precision, data):
    import numpy as np
    import torch
    from composer import Callback, Trainer
    from composer.algorithms import GradientClipping
    from composer.optim import ConstantWithWarmupScheduler, DecoupledAdamW
    from llmfoundry.models.mpt import ComposerMPTCausalLM
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    clean_stale_shared_memory()
    model = ComposerMPTCausalLM(d_model=case["d_model"], n_heads=case["n_heads"], n_layers=case["n_layers"],
                                expansion_ratio=4, max_seq_len=case["seq"], vocab_size=case["vocab"], no_bias=True,
                                norm_type="layernorm", attn_config={"attn_impl": "torch", "alibi": True},
                                init_device="cpu", loss_fn="torch_crossentropy", use_train_metrics=False)
    ds = StreamingDataset(local=str(data), split="train", shuffle=True, shuffle_seed=17, batch_size=case["batch"])

    def collate(samples):
        ids = torch.from_numpy(np.stack([s["tokens"][:case["seq"]] for s in samples]).astype(np.int64))
        return {"input_ids": ids, "labels": ids.clone()}

    loader = torch.utils.data.DataLoader(ds, batch_size=case["batch"], num_workers=1, drop_last=True,
                                         collate_fn=collate)

    class BatchEnds(Callback):
        def __init__(self):
            self.times = []

        def batch_end(self, state, logger):
            self.times.append(time.perf_counter())

    ends = BatchEnds()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{case['warmup'] + case['steps']}ba",
                      optimizers=DecoupledAdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8,
                                                weight_decay=0.0),
                      schedulers=ConstantWithWarmupScheduler(t_warmup="0ba"),
                      algorithms=[GradientClipping(clipping_type="norm", clipping_threshold=1.0)],
                      precision=precision, device="cpu", device_train_microbatch_size=case["batch"],
                      callbacks=[ends], progress_bar=False, log_to_console=False, seed=17)
    trainer.fit()
    elapsed = ends.times[-1] - ends.times[case["warmup"] - 1]
    print(json.dumps({"tokens_per_s": case["batch"] * case["seq"] * case["steps"] / elapsed,
                      "torch": torch.__version__}))


def composer(case_name, precision, work):
    """Composer + LLM Foundry's tokens/s, or None where it is not installed or refuses the precision on CPU."""
    if not os.path.exists(COMPOSER_PYTHON) or precision != "fp32":
        return None
    # As it runs by default (no malloc settings), as the "PyTorch" column.
    out = subprocess.run([COMPOSER_PYTHON, __file__, "--composer-worker", case_name, precision, str(work / "data"),
                          *step_args()],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"Composer worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def pytorch(case_name, precision, work, tuned):
    env = dict(os.environ, **(TUNED_MALLOC if tuned else {}))
    out = subprocess.run([sys.executable, __file__, "--worker", case_name, precision, str(work / "data"),
                          *step_args()],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="tiny,125m")
    ap.add_argument("--precisions", default="fp32,amp_bf16")
    ap.add_argument("--steps", type=int, help="timed steps per case (default: the case's own)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default: the case's own)")
    ap.add_argument("--worker", nargs=3, metavar=("CASE", "PRECISION", "DATA"))
    ap.add_argument("--composer-worker", nargs=3, metavar=("CASE", "PRECISION", "DATA"))
    args = ap.parse_args()
    STEPS.update({k: v for k, v in (("steps", args.steps), ("warmup", args.warmup)) if v is not None})
    if args.worker:
        name, precision, data = args.worker
        pytorch_worker(case_for(name, precision), precision, pathlib.Path(data))
        return
    if args.composer_worker:
        name, precision, data = args.composer_worker
        composer_worker(case_for(name, precision), precision, pathlib.Path(data))
        return
    if not os.path.exists(COMPOSER_PYTHON):
        print(f"Composer + LLM Foundry: not measured ({COMPOSER_PYTHON} missing; tools/setup_composer.sh installs it)")
    print(f"median of {args.rounds} alternating rounds; tokens/s; ratio = Tessera / PyTorch eager, "
          "ratio* = Tessera / PyTorch eager with Tessera's malloc settings (medians of the per-round ratios)")
    print(f"{'case':<6}{'precision':<10}{'Tessera':>9}{'PyTorch':>9}{'PT+malloc':>11}{'ratio':>7}{'ratio*':>8}"
          f"{'MFU T':>8}{'MFU PT':>8}{'MFU PT+':>9}{'GEMM peak':>13}{'Composer':>10}{'T/Comp':>8}")
    rows = []
    for name in args.cases.split(","):
        case = CASES[name]
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"tessera_train_bench_{name}_"))
        try:
            write_data(work / "data", case)
            for precision in args.precisions.split(","):
                ours, theirs, tuned, comp = [], [], [], []
                run = case_for(name, precision)
                emulated = precision == "amp_bf16" and bench_json.cpu_bf16_emulated()
                for k in range(1 if emulated else args.rounds):
                    ours.append(tessera(run, precision, work))
                    theirs.append(pytorch(name, precision, work, tuned=False)["tokens_per_s"])
                    tuned.append(pytorch(name, precision, work, tuned=True)["tokens_per_s"])
                    comp.append(composer(name, precision, work))
                    o = ours[-1]["tokens_per_s"]
                    if comp[-1] is not None:
                        print(f"  {name} {precision} round {k + 1}: Composer {comp[-1]:.1f} tok/s; Tessera / Composer "
                              f"{o / comp[-1]:.2f}", file=sys.stderr, flush=True)
                    print(f"  {name} {precision} round {k + 1}: Tessera {o:.1f}, PyTorch {theirs[-1]:.1f}, PT+malloc "
                          f"{tuned[-1]:.1f} tok/s; ratio {o / theirs[-1]:.2f}, ratio* {o / tuned[-1]:.2f}; GEMM peak "
                          f"{ours[-1]['gemm_peak'] / 1e9:.0f} GF/s", file=sys.stderr, flush=True)
                t = statistics.median(r["tokens_per_s"] for r in ours)
                p, pt = statistics.median(theirs), statistics.median(tuned)
                ratio = statistics.median(r["tokens_per_s"] / x for r, x in zip(ours, theirs))
                ratio_t = statistics.median(r["tokens_per_s"] / x for r, x in zip(ours, tuned))
                if comp[0] is not None:
                    cm = statistics.median(comp)
                    comp_cells = f"{cm:>10.1f}{statistics.median(r['tokens_per_s'] / x for r, x in zip(ours, comp)):>8.2f}"
                else:
                    comp_cells = f"{'-':>10}{'-':>8}"
                f = ours[0]["flops_per_token"]
                peak = statistics.median(r["gemm_peak"] for r in ours)
                mfu = [None if emulated else x * f / peak for x in (t, p, pt)]
                print(f"{name:<6}{precision:<10}{t:>9.1f}{p:>9.1f}{pt:>11.1f}{ratio:>7.2f}{ratio_t:>8.2f}"
                      f"{bench_json.pct(mfu[0], 8)}{bench_json.pct(mfu[1], 8)}{bench_json.pct(mfu[2], 9)}"
                      f"{peak / 1e9:>9.0f} GF/s"
                      f"{comp_cells}",
                      flush=True)
                if emulated:
                    print(f"  ({name} {precision}: {bench_json.EMULATED_BF16_NOTE})", flush=True)
                label = f"{name} {precision}" + (f" ({bench_json.EMULATED_BF16_NOTE})" if emulated else "")
                rows.append({"case": label,
                             "bf16_emulated": emulated, "unit": "tokens/s", "tessera": t,
                             "peers": {"PyTorch eager": p, "PyTorch eager + malloc settings": pt,
                                       "Composer + LLM Foundry": statistics.median(comp) if comp[0] is not None
                                       else None},
                             "ratio_vs_pytorch": ratio, "ratio_vs_pytorch_malloc": ratio_t, "mfu": mfu[0],
                             "peer_mfu": {"PyTorch eager": mfu[1], "PyTorch eager + malloc settings": mfu[2]},
                             "timed_steps": run["steps"],
                             "gemm_peak_flops": peak, "rounds": len(ours)})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    bench_json.emit("train_vs_pytorch", rows, title="End-to-end training step (CPU): Tessera train vs PyTorch")


if __name__ == "__main__":
    main()
