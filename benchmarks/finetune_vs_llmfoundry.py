"""Fine-tuning (CPU, fp32): Tessera's `train` on the CPU SFT recipe against LLM Foundry + Composer on the same weights
and the same data, in the same run; and the fine-tuning loader's packing efficiency against LLM Foundry's.

Throughput. Both sides fine-tune the same GPT-2-layout folder (the main job's export,
runs/mpt-tiny-cpu/hf/huggingface/final, when it exists; otherwise a GPT-2 of the same shape, d 256, 4 heads, 4
layers, 1024 inner, vocab 8192, tied embeddings, no dropout, random weights, written to a temporary folder) on the
train split of data/fortunes_sft (tools/prepare_sft_data.sh) with recipes/sft-tiny-cpu.yaml's loader (max_seq_len 128,
prompt/response rows, loss on the responses, shuffle seed 17, pad trimming, drop_last), global batch 32, its
microbatch 16, decoupled AdamW (lr 5e-4, betas 0.9/0.95, wd 0), linear decay with 10 warm-up batches, global-norm
clipping at 1.0, loss averaged over the batch's loss tokens (accumulate_train_batch_on_tokens), in fp32:

- Tessera: `build/bin/train --recipe recipes/sft-tiny-cpu.yaml precision=fp32 max_duration=(W+N)ba eval_interval=0
  eval_first=false ...`; the time of the N timed batches is the difference of the jsonl log's time/train (the
  trainer's clock: each batch from its dataloader call to the end of its optimizer step) between the last warm-up
  batch and the last batch. Process start-up, loading the model and tokenizing the rows are outside it.
- LLM Foundry: what its train.py builds from the same recipe: build_finetuning_dataloader (num_workers 0, as the
  recipe, whose loader Tessera runs on the training thread too), llmfoundry.models.hf.ComposerHFCausalLM on the same
  folder (no train metrics; attention as LLM Foundry picks it when the recipe names none: `eager`; `--foundry-attn
  eager,sdpa` adds transformers' SDPA as a second column), Composer's DecoupledAdamW, LinearWithWarmupScheduler and
  GradientClipping, composer.Trainer(device cpu, precision fp32), timed from the end of the last warm-up batch to the
  end of the last batch (batch_end callbacks); building the loader and the model is outside it.

Both sides train on the same batches (tests/composer/test_finetuning_loss_vs_llmfoundry.py; here each batch's token
counts are compared and a difference is flagged). Reported per side: all tokens/s (non-padding tokens, the
attention_mask sum) and loss tokens/s (labels[:, 1:] != -100), and Tessera / LLM Foundry. Both processes get the same
thread count (OMP_NUM_THREADS, and torch.set_num_threads in LLM Foundry's) and the glibc malloc settings Tessera's
train gives itself (bench_json.TUNED_MALLOC, through the environment). Rounds alternate the sides; the table gives
median tokens/s and the median of the per-round ratios.

Packing. One epoch of the same split (max_seq_len 128, device batch 32, shuffle seed 17, drop_last, no pad trimming)
at each packing_ratio, through `tessera_compat_driver finetuning-batches` and LLM Foundry's
build_finetuning_dataloader (its BinPackCollator): the padding fraction 1 - real tokens / (rows x max_seq_len) and
the waste 1 - packed tokens / tokens drawn (examples left in leftover bins at the end of the epoch; the collator's
`waste`), for both; they should be equal (the batches are token for token LLM Foundry's,
tests/composer/test_finetuning_vs_llmfoundry.py), and a difference is flagged. Ratio 1 is given for context, without
and with pad trimming (the recipe's loader; there the padding is over the trimmed batch widths). Packing is a loader
figure only: the recipe does not pack (GPT-2 has no sequence_id attention).

    python benchmarks/finetune_vs_llmfoundry.py [--rounds 3] [--warmup 5] [--steps 40] [--ratios 1.5,2,3]
                                                [--foundry-attn eager] [--model HF_FOLDER]

LLM Foundry runs in ~/.cache/tessera/venv-composer (tools/setup_tests.sh runs tools/setup_composer.sh; or TESSERA_COMPOSER_PYTHON). Without it
only Tessera's figures are printed.
"""
import argparse
import copy
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
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin"))
TRAIN = os.environ.get("TESSERA_TRAIN_BIN", str(BIN / "train"))
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(BIN / "tessera_compat_driver"))
COMPOSER_PYTHON = os.environ.get("TESSERA_COMPOSER_PYTHON",
                                 str(pathlib.Path.home() / ".cache" / "tessera" / "venv-composer" / "bin" / "python"))
RECIPE = ROOT / "recipes" / "sft-tiny-cpu.yaml"
DATA = ROOT / "data" / "fortunes_sft"
CORPUS_TOKENIZER = ROOT / "data" / "fortunes" / "tokenizer.json"
MAIN_JOB_MODEL = ROOT / "runs" / "mpt-tiny-cpu" / "hf" / "huggingface" / "final"
TUNED_MALLOC = bench_json.TUNED_MALLOC
# The main job's exported model (recipes/mpt-tiny-cpu.yaml -> GPT-2 layout), as transformers' GPT2Config.
GPT2_SHAPE = dict(n_embd=256, n_layer=4, n_head=4, n_inner=1024, n_positions=128, vocab_size=8192,
                  tie_word_embeddings=True, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=None, eos_token_id=None)
FOUNDRY = "LLM Foundry + Composer"


# ---------------------------------------------------------------------------------------------------------------
# Inputs

def ensure_data():
    if (DATA / "train.jsonl").exists() and (DATA / "tokenizer" / "tokenizer.json").exists():
        return
    if not CORPUS_TOKENIZER.exists():
        sys.exit(f"finetune_vs_llmfoundry: {DATA} is missing and so is {CORPUS_TOKENIZER}, which "
                 "tools/prepare_sft_data.sh needs: run tools/prepare_corpus.sh, then tools/prepare_sft_data.sh")
    print(f"{DATA} missing: running tools/prepare_sft_data.sh", flush=True)
    subprocess.run([str(ROOT / "tools" / "prepare_sft_data.sh")], cwd=ROOT, check=True)


def make_gpt2(folder):
    """A GPT-2 of the main job's shape with random weights (seed 17), saved as an HF folder."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(17)
    GPT2LMHeadModel(GPT2Config(**GPT2_SHAPE)).save_pretrained(folder, safe_serialization=True)


def model_folder(arg, work):
    if arg:
        return pathlib.Path(arg).resolve(), "given"
    if (MAIN_JOB_MODEL / "config.json").exists():
        return MAIN_JOB_MODEL, "the main job's export"
    folder = work / "gpt2"
    try:
        make_gpt2(folder)
    except ImportError:  # this Python has no transformers: LLM Foundry's venv has
        subprocess.run([COMPOSER_PYTHON, __file__, "--make-gpt2", str(folder)], check=True)
    return folder, "a random-weight GPT-2 of the main job's shape; runs/mpt-tiny-cpu has no export here"


def overrides(args, model, log):
    return [f"variables.model_path={model}", f"variables.data_local={DATA}", "precision=fp32",
            f"max_duration={args.warmup + args.steps}ba", "eval_interval=0", "eval_first=false",
            f"device_train_microbatch_size={args.microbatch}", "accumulate_train_batch_on_tokens=true",
            f"loggers.jsonl.filename={log}", "callbacks.speed_monitor.time_unit=seconds", "log_to_console=false"]


def resolved_recipe(args, model, work):
    out = subprocess.run([TRAIN, "--recipe", str(RECIPE), "--print-config"] + overrides(args, model, work / "x.jsonl"),
                         capture_output=True, text=True, cwd=work)
    if out.returncode != 0:
        sys.exit(f"{TRAIN} --print-config failed:\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def foundry_settings(cfg, args):
    """What LLM Foundry's train.py builds from the resolved recipe (the parts that matter here)."""
    opt, sch = cfg["optimizer"], cfg["scheduler"]
    clip = cfg.get("algorithms", {}).get("gradient_clipping")
    loader = cfg["train_loader"]
    # The LLM Foundry side below is written for these (the recipe's); anything else would not be the same run.
    if (opt["name"], sch["name"], loader["name"], loader.get("num_workers", 0)) != (
            "decoupled_adamw", "linear_decay_with_warmup", "finetuning", 0):
        sys.exit(f"finetune_vs_llmfoundry: {RECIPE} changed (optimizer {opt['name']}, scheduler {sch['name']}, "
                 f"loader {loader['name']} with {loader.get('num_workers', 0)} workers); update the LLM Foundry side")
    return {"tokenizer": cfg["tokenizer"]["name"], "model": cfg["model"]["pretrained_model_name_or_path"],
            "dataset": cfg["train_loader"]["dataset"], "drop_last": cfg["train_loader"].get("drop_last", False),
            "batch": cfg["global_train_batch_size"], "microbatch": cfg["device_train_microbatch_size"],
            "on_tokens": cfg["accumulate_train_batch_on_tokens"], "seed": cfg["seed"],
            "optimizer": {k: opt[k] for k in ("lr", "betas", "eps", "weight_decay")},
            "scheduler": {"t_warmup": sch["t_warmup"], "alpha_f": sch.get("alpha_f", 0.0)},
            "clipping": clip, "warmup": args.warmup, "steps": args.steps, "threads": args.threads}


def thread_env(threads):
    return dict(os.environ, OMP_NUM_THREADS=str(threads), **TUNED_MALLOC)


# ---------------------------------------------------------------------------------------------------------------
# Batch statistics (the same arithmetic for both sides)

def stats_of(batch):
    """(real tokens, loss tokens, rows, width) of one batch given as lists of rows."""
    mask, labels = batch["attention_mask"], batch["labels"]
    real = sum(sum(r) for r in mask)
    loss = sum(sum(1 for v in r[1:] if v != -100) for r in labels)
    return [real, loss, len(mask), len(mask[0]) if mask else 0]


def first_difference(a, b):
    if len(a) != len(b):
        return f"{len(a)} batches vs {len(b)}"
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"batch {k}: (real, loss, rows, width) {x} vs {y}"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Tessera

def tessera_batches(tokenizer, dataset, batch, drop_last, work, name):
    config = {"tokenizer": str(tokenizer), "device_batch_size": batch, "drop_last": drop_last, "dataset": dataset}
    (work / f"{name}.json").write_text(json.dumps(config))
    out = work / f"{name}-out.json"
    proc = subprocess.run([DRIVER, "finetuning-batches", str(work / f"{name}.json"), str(out)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.exit(f"{DRIVER} finetuning-batches failed:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    return {"batches": [stats_of(b) for b in result["batches"]], "packing": result["packing"],
            "examples": result["examples"], "packing_ratio": result["packing_ratio"]}


def tessera_train(args, model, work, k):
    log = work / f"tessera-{k}.jsonl"
    log.unlink(missing_ok=True)
    proc = subprocess.run([TRAIN, "--recipe", str(RECIPE)] + overrides(args, model, log), cwd=work,
                          capture_output=True, text=True, env=thread_env(args.threads))
    if proc.returncode != 0:
        sys.exit(f"{TRAIN} --recipe {RECIPE} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    times = [r["time/train"] for r in map(json.loads, log.read_text().splitlines()) if "time/train" in r]
    n = args.warmup + args.steps
    if len(times) != n:
        sys.exit(f"Tessera's log {log} has {len(times)} batches, expected {n}")
    return times[n - 1] - times[args.warmup - 1]


# ---------------------------------------------------------------------------------------------------------------
# LLM Foundry (these run in its venv)

def foundry_env(work):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["HF_DATASETS_CACHE"] = str(work / "hf_datasets")


def foundry_loader(tokenizer, dataset, batch, drop_last):
    from llmfoundry.data.finetuning import build_finetuning_dataloader
    return build_finetuning_dataloader(tokenizer=tokenizer, device_batch_size=batch, dataset=copy.deepcopy(dataset),
                                       num_workers=0, drop_last=drop_last, pin_memory=False, prefetch_factor=None,
                                       persistent_workers=False)


def torch_stats(batch):
    labels = batch["labels"]
    return [int(batch["attention_mask"].sum()), int((labels[:, 1:] != -100).sum()), int(labels.shape[0]),
            int(labels.shape[1])]


def foundry_train_worker(spec_path):
    spec = json.loads(pathlib.Path(spec_path).read_text())
    foundry_env(pathlib.Path(spec["work"]))
    import torch
    from composer import Callback, Trainer
    from composer.algorithms import GradientClipping
    from composer.optim import DecoupledAdamW, LinearWithWarmupScheduler
    from llmfoundry.models.hf import ComposerHFCausalLM
    from transformers import AutoTokenizer
    torch.set_num_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    loader = foundry_loader(tokenizer, spec["dataset"], spec["batch"], spec["drop_last"])
    model = ComposerHFCausalLM(tokenizer=tokenizer, pretrained_model_name_or_path=spec["model"], pretrained=True,
                               trust_remote_code=False, use_train_metrics=False, init_device="cpu",
                               attn_implementation=spec["attn"])
    o = spec["optimizer"]
    clip = spec["clipping"]
    algorithms = [GradientClipping(clipping_type=clip["clipping_type"], clipping_threshold=clip["clipping_threshold"])
                  ] if clip else []

    class Record(Callback):
        def __init__(self):
            self.stats, self.ends = [], []

        def batch_start(self, state, logger):
            self.stats.append(torch_stats(state.batch))

        def batch_end(self, state, logger):
            self.ends.append(time.perf_counter())

    record = Record()
    trainer = Trainer(model=model, train_dataloader=loader,
                      optimizers=DecoupledAdamW(model.parameters(), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                                weight_decay=o["weight_decay"]),
                      schedulers=LinearWithWarmupScheduler(t_warmup=spec["scheduler"]["t_warmup"],
                                                           alpha_f=spec["scheduler"]["alpha_f"]),
                      algorithms=algorithms, max_duration=f"{spec['warmup'] + spec['steps']}ba",
                      device_train_microbatch_size=spec["microbatch"],
                      accumulate_train_batch_on_tokens=spec["on_tokens"], precision="fp32", device="cpu",
                      seed=spec["seed"], callbacks=[record], progress_bar=False, log_to_console=False,
                      save_folder=None)
    trainer.fit()
    trainer.close()
    w = spec["warmup"]
    print(json.dumps({"seconds": record.ends[-1] - record.ends[w - 1], "batches": record.stats,
                      "attn": model.model.config._attn_implementation, "threads": torch.get_num_threads(),
                      "torch": torch.__version__}))


def foundry_batches_worker(spec_path):
    spec = json.loads(pathlib.Path(spec_path).read_text())
    foundry_env(pathlib.Path(spec["work"]))
    from llmfoundry.data.packing import BinPackCollator
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    results = []
    for dataset in spec["datasets"]:
        spec_ = foundry_loader(tokenizer, dataset, spec["batch"], spec["drop_last"])
        dl = spec_.dataloader
        dl.sampler.set_epoch(0)  # what Composer's Trainer does at the start of the epoch
        batches = [torch_stats(b) for b in dl]
        collator = dl.collate_fn  # LossGeneratingTokensCollatorWrapper(BinPackCollator(...)) when packing
        while not isinstance(collator, BinPackCollator) and hasattr(collator, "base_collator"):
            collator = collator.base_collator
        packing = None
        if isinstance(collator, BinPackCollator):
            packing = {"total_tokens": collator.n_total_tokens, "packed_tokens": collator.n_packed_tokens,
                       "rows": collator.n_packed_examples, "waste": collator.waste,
                       "efficiency": collator.efficiency}
        results.append({"batches": batches, "packing": packing, "examples": len(dl.dataset)})
    print(json.dumps(results))


def run_foundry(mode, spec, work, env=None):
    path = work / f"foundry-{mode}.json"
    path.write_text(json.dumps(dict(spec, work=str(work))))
    proc = subprocess.run([COMPOSER_PYTHON, __file__, f"--foundry-{mode}", str(path)], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        sys.exit(f"LLM Foundry's {mode} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------

def throughput(args, cfg, model, work, have_foundry):
    settings = foundry_settings(cfg, args)
    ds = settings["dataset"]
    ours = tessera_batches(settings["tokenizer"], ds, settings["batch"], settings["drop_last"], work, "recipe")
    n = args.warmup + args.steps
    if len(ours["batches"]) < n:
        sys.exit(f"the train split has {len(ours['batches'])} batches, fewer than {n}")
    timed = ours["batches"][args.warmup:n]
    real, loss = sum(b[0] for b in timed), sum(b[1] for b in timed)
    attns = args.foundry_attn.split(",") if have_foundry else []
    t_secs, f_secs = [], {a: [] for a in attns}
    checks, attn_used, peer_torch = [], {}, None
    for k in range(args.rounds):
        t_secs.append(tessera_train(args, model, work, k))
        line = f"  round {k + 1}: Tessera {real / t_secs[-1]:.0f} tok/s"
        for a in attns:
            r = run_foundry("train", dict(settings, attn=a), work, env=thread_env(args.threads))
            f_secs[a].append(r["seconds"])
            attn_used[a], peer_torch = r["attn"], r["torch"]
            checks.append(first_difference(ours["batches"][:n], r["batches"]))
            line += (f", LLM Foundry ({r['attn']}) {real / r['seconds']:.0f} tok/s "
                     f"(Tessera / LLM Foundry {r['seconds'] / t_secs[-1]:.2f})")
        print(line, file=sys.stderr, flush=True)
    mismatch = next((c for c in checks if c), None)
    t = statistics.median(t_secs)
    print(f"Fine-tuning throughput: {RECIPE.relative_to(ROOT)} in fp32 on {model}; global batch {settings['batch']}, "
          f"microbatch {settings['microbatch']}, max_seq_len {ds['max_seq_len']}, pad trimming "
          f"{'on' if ds.get('allow_pad_trimming') else 'off'}; {args.warmup} warm-up + {args.steps} timed batches "
          f"({real} tokens, {loss} loss tokens), median of {args.rounds} alternating round(s)")
    print(f"set for both processes: OMP_NUM_THREADS={args.threads} (LLM Foundry also torch.set_num_threads("
          f"{args.threads})), " + " ".join(f"{k}={v}" for k, v in TUNED_MALLOC.items())
          + " (Tessera's train also sets these itself)")
    print(f"{'side':<40}{'tokens/s':>10}{'loss tok/s':>12}{'s/batch':>9}")
    print(f"{'Tessera train':<40}{real / t:>10.0f}{loss / t:>12.0f}{t / args.steps:>9.3f}")
    rows_all = {"case": "SFT fp32, all tokens", "unit": "tokens/s", "tessera": real / t, "peers": {},
                "rounds": args.rounds, "timed_batches": args.steps, "tokens": real}
    rows_loss = {"case": "SFT fp32, loss tokens", "unit": "loss tokens/s", "tessera": loss / t, "peers": {},
                 "rounds": args.rounds, "timed_batches": args.steps, "tokens": loss}
    for a in attns:
        f = statistics.median(f_secs[a])
        ratio = statistics.median(x / y for x, y in zip(f_secs[a], t_secs))  # time ratio = throughput ratio
        name = f"{FOUNDRY} ({attn_used[a]} attention)"
        print(f"{name:<40}{real / f:>10.0f}{loss / f:>12.0f}{f / args.steps:>9.3f}")
        print(f"{'  Tessera / LLM Foundry (' + attn_used[a] + ')':<40}{ratio:>9.2f}x{ratio:>11.2f}x")
        for row, count in ((rows_all, real), (rows_loss, loss)):
            row["peers"][name] = count / f
            row[f"ratio_vs_{attn_used[a]}"] = ratio
    if not have_foundry:
        print(f"{FOUNDRY}: not measured ({COMPOSER_PYTHON} missing; tools/setup_composer.sh installs it)")
        for row in (rows_all, rows_loss):
            row["peers"][FOUNDRY] = None
    elif mismatch:
        print(f"WARNING: the two sides' batches differ ({mismatch}); the tokens/s above count Tessera's batches")
    else:
        print(f"batches: the same token counts on both sides for all {n} batches")
    for row in (rows_all, rows_loss):
        row["same_batches"] = None if not have_foundry else mismatch is None
    if peer_torch:
        print(f"LLM Foundry's venv: torch {peer_torch}")
    return [rows_all, rows_loss], ours


def packing(args, cfg, work, have_foundry, recipe_batches):
    base = dict(cfg["train_loader"]["dataset"])
    tokenizer, drop_last = cfg["tokenizer"]["name"], cfg["train_loader"].get("drop_last", False)
    batch = cfg["global_train_batch_size"]  # one rank: the device batch
    seq = base["max_seq_len"]
    plain = {k: v for k, v in base.items() if k not in ("allow_pad_trimming", "packing_ratio")}
    cases = [("1 (no packing)", dict(plain)), ("1 + pad trimming (recipe)", dict(plain, allow_pad_trimming=True))]
    cases += [(f"{float(r):g}", dict(plain, packing_ratio=float(r))) for r in args.ratios.split(",") if r]
    ours = []
    for k, (name, ds) in enumerate(cases):
        if ds == base and recipe_batches is not None:
            ours.append(recipe_batches)
        else:
            ours.append(tessera_batches(tokenizer, ds, batch, drop_last, work, f"pack{k}"))
    theirs = (run_foundry("batches", {"tokenizer": tokenizer, "datasets": [ds for _, ds in cases], "batch": batch,
                                      "drop_last": drop_last}, work)
              if have_foundry else [None] * len(cases))

    def figures(r, packed):
        b = r["batches"]
        real = sum(x[0] for x in b)
        slots = sum(x[2] * x[3] for x in b)
        out = {"padding": 1 - real / slots, "real_per_row": real / sum(x[2] for x in b), "batches": len(b),
               "waste": None}
        if packed and r["packing"]:
            p = r["packing"]
            out["waste"] = 1 - p["packed_tokens"] / p["total_tokens"]
            out["padding_stats"] = 1 - p["packed_tokens"] / (p["rows"] * seq)  # the collator's 1 - efficiency
        return out

    print()
    print(f"Packing efficiency: one epoch of {base['hf_name']} split {base['split']}, max_seq_len {seq}, device batch "
          f"{batch}, shuffle seed {base.get('shuffle_seed')}, drop_last {drop_last}; padding = 1 - real tokens / "
          f"(rows x width), waste = 1 - packed / drawn tokens")
    print(f"{'packing_ratio':<27}{'batches':>8}{'tok/row':>9}{'padding T':>11}{'padding LF':>12}{'waste T':>9}"
          f"{'waste LF':>10}  same batches")
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    rows = []
    for (name, ds), o, t in zip(cases, ours, theirs):
        packed = ds.get("packing_ratio", 1) != 1
        fo = figures(o, packed)
        ft = figures(t, packed) if t else None
        diff = first_difference(o["batches"], t["batches"]) if t else None
        if fo.get("padding_stats") is not None and abs(fo["padding_stats"] - fo["padding"]) > 1e-12:
            diff = (diff or "") + f" Tessera's packing stats say padding {pct(fo['padding_stats'])}"
        if ft and ft.get("padding_stats") is not None and abs(ft["padding_stats"] - ft["padding"]) > 1e-12:
            diff = (diff or "") + f" LLM Foundry's collator says padding {pct(ft['padding_stats'])}"
        if ft and packed and (fo["waste"] is None or ft["waste"] is None or abs(fo["waste"] - ft["waste"]) > 1e-12):
            diff = (diff or "") + " the waste differs"
        same = "-" if t is None else "yes" if diff is None else f"NO: {diff}"
        print(f"{name:<27}{fo['batches']:>8}{fo['real_per_row']:>9.1f}{pct(fo['padding']):>11}"
              f"{pct(ft['padding'] if ft else None):>12}{pct(fo['waste']):>9}{pct(ft['waste'] if ft else None):>10}"
              f"  {same}")
        rows.append({"case": f"packing {name}", "unit": "% real tokens", "tessera": 100 * (1 - fo["padding"]),
                     "peers": {"LLM Foundry": 100 * (1 - ft["padding"]) if ft else None},
                     "padding_fraction": fo["padding"], "padding_fraction_llmfoundry": ft["padding"] if ft else None,
                     "waste": fo["waste"], "waste_llmfoundry": ft["waste"] if ft else None,
                     "tokens_per_row": fo["real_per_row"], "same_batches": None if t is None else diff is None})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5, help="untimed batches first (at least 1)")
    ap.add_argument("--steps", type=int, default=40, help="timed batches")
    ap.add_argument("--microbatch", type=int, default=16, help="device_train_microbatch_size (the recipe's: 16)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--ratios", default="1.5,2,3", help="packing ratios (ratio 1 is always given)")
    ap.add_argument("--foundry-attn", default="eager",
                    help="LLM Foundry's attn_implementation(s): eager (its default), sdpa")
    ap.add_argument("--model", default=None, help="HF folder to fine-tune (default: the main job's export if present, "
                                                  "else a random GPT-2 of its shape)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--foundry-train", metavar="SPEC")
    ap.add_argument("--foundry-batches", metavar="SPEC")
    ap.add_argument("--make-gpt2", metavar="DIR")
    args = ap.parse_args()
    if args.foundry_train:
        return foundry_train_worker(args.foundry_train)
    if args.foundry_batches:
        return foundry_batches_worker(args.foundry_batches)
    if args.make_gpt2:
        return make_gpt2(args.make_gpt2)
    if args.warmup < 1:
        ap.error("--warmup must be at least 1 (the timed span starts at the end of a warm-up batch)")
    for binary in (TRAIN, DRIVER):
        if not os.access(binary, os.X_OK):
            sys.exit(f"finetune_vs_llmfoundry: {binary} not found; build the project first")
    ensure_data()
    have_foundry = os.path.exists(COMPOSER_PYTHON)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tessera_finetune_bench_"))
    try:
        model, origin = model_folder(args.model, work)
        print(f"model: {model} ({origin})", flush=True)
        cfg = resolved_recipe(args, model, work)
        rows, recipe_batches = [], None
        if not args.skip_throughput:
            rows, recipe_batches = throughput(args, cfg, model, work, have_foundry)
        rows += packing(args, cfg, work, have_foundry, recipe_batches)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bench_json.emit("finetune_vs_llmfoundry", rows, model=origin,
                    title="Fine-tuning (CPU SFT recipe, fp32): Tessera train vs LLM Foundry + Composer")


if __name__ == "__main__":
    main()
