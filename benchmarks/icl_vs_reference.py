"""ICL evaluation throughput (examples per second): Tessera's `eval` against the Python reference
(tests/compat/icl_reference.py: LLM Foundry's procedure over HF `transformers`' MptForCausalLM and HF `tokenizers`),
on the same model, tokenizer and task files, measured in the same run.

The model is a random MPT built with HF's MptConfig (default: d_model 512, 8 layers, max_seq_len 512) and saved with
save_pretrained; the tokenizer is a byte-level BPE trained by HF on the fortunes corpus. Tasks: the LLM Foundry task
subsets in tests/data/icl (language modeling: LAMBADA; multiple choice: PIQA, ARC-Easy, COPA). Both sides run on the
CPU in fp32 with the same number of intra-op threads. The reference scores rows as LLM Foundry does: right-padded to
max_seq_len, in batches (--ref-batch-size, LLM Foundry's default 4); Tessera's `eval` scores --batch-size rows per
forward pass (default: the same), each batch padded to its longest row, the longest rows first. Each task's time includes building its prompts (tokenization) on both sides. The correct counts are checked
equal, so both sides did the same work.

    python benchmarks/icl_vs_reference.py [--d-model 512] [--n-layers 8] [--max-seq-len 512] [--threads 2]
        [--batch-size 4] [--ref-batch-size 4]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import bench_json

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import yaml  # noqa: E402
from tokenizers import ByteLevelBPETokenizer, Tokenizer  # noqa: E402
from transformers import MptConfig, MptForCausalLM  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
EVAL = os.environ.get("TESSERA_EVAL_BIN", str(ROOT / "build" / "bin" / "eval"))
DATA = ROOT / "tests" / "data" / "icl"
sys.path.insert(0, str(ROOT / "tests" / "compat"))
from icl_reference import Task, evaluate  # noqa: E402
from test_tokenizer_hf import read_fortunes  # noqa: E402

TASKS = [
    dict(label="lambada_openai", file="lambada_openai.jsonl", icl_task_type="language_modeling", num_fewshot=[0, 3]),
    dict(label="piqa", file="piqa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0],
         continuation_delimiter="\nAnswer: "),
    dict(label="arc_easy", file="arc_easy.jsonl", icl_task_type="multiple_choice", num_fewshot=[3],
         continuation_delimiter="\nAnswer: "),
    dict(label="copa", file="copa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ref-batch-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=None, help="Tessera's rows per forward (default: --ref-batch-size)")
    args = ap.parse_args()
    if args.batch_size is None:
        args.batch_size = args.ref_batch_size
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(read_fortunes(), vocab_size=args.vocab_size, min_frequency=2,
                                special_tokens=["<|endoftext|>"], show_progress=False)
        bpe.save(str(tmp / "tokenizer.json"))
        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
        eos = tok.token_to_id("<|endoftext|>")
        torch.manual_seed(0)
        model = MptForCausalLM(MptConfig(d_model=args.d_model, n_heads=args.d_model // 64, n_layers=args.n_layers,
                                         vocab_size=tok.get_vocab_size(), max_seq_len=args.max_seq_len)).eval()
        model.save_pretrained(tmp / "hf", safe_serialization=True)
        tasks = []
        for t in TASKS:
            cfg = {k: v for k, v in t.items() if k != "file"}
            cfg["dataset_uri"] = str(DATA / t["file"])
            tasks.append(cfg)
        (tmp / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": tasks}))

        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run([EVAL, "--model", tmp / "hf", "--tokenizer", tmp / "tokenizer.json", "--tasks",
                               tmp / "tasks.yaml", "--output", tmp / "results.json", "--batch-size", str(args.batch_size),
                               "--precision", "fp32"],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"eval failed:\n{proc.stderr}")
        ours = {(r["label"], r["num_fewshot"]): r for r in json.loads((tmp / "results.json").read_text())["results"]}

        print(f"MPT d_model {args.d_model}, {args.n_layers} layers, vocab {tok.get_vocab_size()}, max_seq_len "
              f"{args.max_seq_len}; CPU fp32, {args.threads} threads; batch size {args.batch_size}, reference's "
              f"{args.ref_batch_size}")
        print("| task | type | examples | Tessera ex/s | reference ex/s | ratio |")
        print("|---|---|---|---|---|---|")
        totals = {}
        for cfg in tasks:
            task = Task(cfg, tok, eos)
            for k in cfg["num_fewshot"]:
                start = time.perf_counter()
                correct, total = evaluate(model, task, k, args.max_seq_len, eos, batch_size=args.ref_batch_size)
                ref_s = time.perf_counter() - start
                mine = ours[(cfg["label"], k)]
                if (mine["correct"], mine["total"]) != (correct, total):
                    sys.exit(f"{cfg['label']}/{k}-shot: Tessera counted {mine['correct']}/{mine['total']}, the "
                             f"reference {correct}/{total}")
                kind = "LM" if cfg["icl_task_type"] == "language_modeling" else "MC"
                t = totals.setdefault(kind, [0, 0.0, 0.0])
                t[0] += total
                t[1] += mine["seconds"]
                t[2] += ref_s
                print(f"| {cfg['label']}/{k}-shot | {kind} | {total} | {total / mine['seconds']:.1f} | "
                      f"{total / ref_s:.1f} | {ref_s / mine['seconds']:.2f}x |")
        rows = []
        for kind, (n, ours_s, ref_s) in totals.items():
            print(f"| all {kind} | {kind} | {n} | {n / ours_s:.1f} | {n / ref_s:.1f} | {ref_s / ours_s:.2f}x |")
            rows.append({"case": f"all {kind} tasks", "unit": "examples/s", "tessera": n / ours_s,
                         "peers": {"reference (HF model, LLM Foundry's prompts)": n / ref_s}, "examples": n,
                         "batch_size": args.batch_size, "ref_batch_size": args.ref_batch_size})
        bench_json.emit("icl_vs_reference", rows, title="ICL evaluation (CPU): Tessera eval vs a reference loop",
                        model={"d_model": args.d_model, "n_layers": args.n_layers, "max_seq_len": args.max_seq_len})


if __name__ == "__main__":
    main()
