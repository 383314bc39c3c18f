"""ICL evaluation throughput (examples per second, CPU fp32): `tessera eval --recipe` against LLM Foundry's own
evaluation entry point (llmfoundry.command_utils.eval_from_yaml, what scripts/eval/eval.py runs) on LLM Foundry's
hf_eval.yaml as published (tests/data/eval/hf_eval.yaml), the same model, tokenizer and task files, in the same run.

The model is a random MPT built with HF's MptConfig (default: d_model 512, 8 layers, max_seq_len 512) saved with
save_pretrained beside a byte-level BPE tokenizer trained by HF on the fortunes corpus; the tasks are the LLM Foundry
task subsets in tests/data/icl (LAMBADA, PIQA, ARC-Easy, COPA, Winograd). Both read the YAML with the same key=value
overrides (the model folder, max_seq_len, the local tasks file, device_eval_batch_size); LLM Foundry's copy drops
fsdp_config and sets init_device: cpu, which its single CPU process needs (as tests/composer/
test_eval_recipe_vs_llmfoundry.py). Each side is timed as one process from start to exit, as a user runs it (LLM
Foundry's in ~/.cache/tessera/venv-composer), with the same intra-op threads. The tables both print are checked
equal, so both did the same work. The issue's goal: Tessera at least 3x LLM Foundry.

    python benchmarks/eval_vs_llmfoundry.py [--d-model 512] [--n-layers 8] [--max-seq-len 512] [--batch-size 4]
        [--threads 2] [--rows 40]
"""
import argparse
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
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import MptConfig, MptForCausalLM, PreTrainedTokenizerFast  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
EVAL = os.environ.get("TESSERA_EVAL_BIN", str(ROOT / "build" / "bin" / "eval"))
COMPOSER_PY = pathlib.Path(os.environ.get("TESSERA_COMPOSER_PYTHON", pathlib.Path(os.environ.get(
    "TESSERA_HOME", pathlib.Path.home() / ".cache" / "tessera")) / "venv-composer" / "bin" / "python"))
DATA = ROOT / "tests" / "data" / "icl"
RECIPE = ROOT / "tests" / "data" / "eval" / "hf_eval.yaml"
sys.path.insert(0, str(ROOT / "tests" / "compat"))
from test_tokenizer_hf import read_fortunes  # noqa: E402

EOS = "<|endoftext|>"
TASKS = [
    dict(label="lambada_openai", file="lambada_openai.jsonl", icl_task_type="language_modeling", num_fewshot=[0]),
    dict(label="piqa", file="piqa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0],
         continuation_delimiter="\nAnswer: "),
    dict(label="arc_easy", file="arc_easy.jsonl", icl_task_type="multiple_choice", num_fewshot=[3],
         continuation_delimiter="\nAnswer: "),
    dict(label="copa", file="copa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0]),
    dict(label="winograd", file="winograd_wsc.jsonl", icl_task_type="schema", num_fewshot=[0]),
]
FOUNDRY = """
import sys, yaml
from llmfoundry.command_utils import eval_from_yaml
eval_from_yaml(sys.argv[1], sys.argv[2:])
"""


def table(text):
    """The rows of the last table printed after "Printing complete results for all models" (Accuracy a float)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Printing complete results for all models"))
    rows = []
    for line in lines[start + 3:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        cells = ["" if c in ("None", "nan") else c for c in cells]
        rows.append((cells[1], cells[2], round(float(cells[3].removeprefix("tensor(").removesuffix(")")), 6),
                     cells[4]))
    return rows


def timed(cmd, env, cwd):
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{proc.stderr[-4000:]}")
    return seconds, table(proc.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--batch-size", type=int, default=4, help="device_eval_batch_size (hf_eval.yaml's is 4)")
    ap.add_argument("--rows", type=int, default=40, help="examples per task file (at most its 40)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if not COMPOSER_PY.exists():
        sys.exit(f"LLM Foundry's venv is missing ({COMPOSER_PY}): run tools/setup_tests.sh")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(read_fortunes(), vocab_size=args.vocab_size, min_frequency=2, special_tokens=[EOS],
                                show_progress=False)
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, pad_token=EOS)
        torch.manual_seed(0)
        model = MptForCausalLM(MptConfig(d_model=args.d_model, n_heads=args.d_model // 64, n_layers=args.n_layers,
                                         vocab_size=len(tok), max_seq_len=args.max_seq_len))
        model.save_pretrained(tmp / "model", safe_serialization=True)
        tok.save_pretrained(tmp / "model")
        tasks, examples = [], 0
        for t in TASKS:
            lines = (DATA / t["file"]).read_text().splitlines()[:args.rows]
            examples += len(lines) * len(t["num_fewshot"])
            (tmp / t["file"]).write_text("\n".join(lines) + "\n")
            tasks.append(dict({k: v for k, v in t.items() if k != "file"}, dataset_uri=str(tmp / t["file"])))
        (tmp / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": tasks}))
        overrides = [f"variables.model_name_or_path={tmp / 'model'}", f"variables.max_seq_len={args.max_seq_len}",
                     f"icl_tasks={tmp / 'tasks.yaml'}", f"device_eval_batch_size={args.batch_size}"]
        theirs_yaml = yaml.safe_load(RECIPE.read_text())
        del theirs_yaml["fsdp_config"], theirs_yaml["eval_gauntlet"]
        theirs_yaml["models"][0]["model"]["init_device"] = "cpu"
        (tmp / "foundry.yaml").write_text(yaml.safe_dump(theirs_yaml))
        ours_yaml = yaml.safe_load(RECIPE.read_text())
        del ours_yaml["fsdp_config"], ours_yaml["eval_gauntlet"]
        (tmp / "tessera.yaml").write_text(yaml.safe_dump(ours_yaml))

        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
        work = tmp / "work"  # where LLM Foundry copies the task files
        work.mkdir()
        ours_s, ours = timed([EVAL, "--recipe", str(tmp / "tessera.yaml"), *overrides], env, work)
        theirs_s, theirs = timed([str(COMPOSER_PY), "-c", FOUNDRY, str(tmp / "foundry.yaml"), *overrides], env, work)
        if [r[:2] + r[3:] for r in ours] != [r[:2] + r[3:] for r in theirs] or any(
                abs(a[2] - b[2]) > 1e-4 for a, b in zip(ours, theirs)):
            sys.exit(f"the tables differ:\nTessera: {ours}\nLLM Foundry: {theirs}")
        print(f"MPT d_model {args.d_model}, {args.n_layers} layers, vocab {len(tok)}, max_seq_len {args.max_seq_len}; "
              f"CPU fp32, {args.threads} threads; device_eval_batch_size {args.batch_size}; {examples} examples in "
              f"{len(TASKS)} tasks; each side one process, start to exit")
        print("| | seconds | examples/s |")
        print("|---|---|---|")
        print(f"| Tessera `eval --recipe` | {ours_s:.1f} | {examples / ours_s:.2f} |")
        print(f"| LLM Foundry eval_from_yaml | {theirs_s:.1f} | {examples / theirs_s:.2f} |")
        print(f"ratio: {theirs_s / ours_s:.2f}x (goal: 3x)")
        bench_json.emit("eval_vs_llmfoundry",
                        [{"case": f"hf_eval.yaml, {len(TASKS)} tasks", "unit": "examples/s",
                          "tessera": examples / ours_s, "peers": {"LLM Foundry eval.py": examples / theirs_s},
                          "examples": examples, "batch_size": args.batch_size, "ratio": theirs_s / ours_s,
                          "timed_steps": examples}],
                        title="ICL evaluation (CPU): tessera eval --recipe vs LLM Foundry's eval.py",
                        model={"d_model": args.d_model, "n_layers": args.n_layers, "max_seq_len": args.max_seq_len})


if __name__ == "__main__":
    main()
