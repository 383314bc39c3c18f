"""Converting a corpus to MDS (CPU): Tessera's `convert_text_to_mds` against LLM Foundry's converters on the same
input, in the same run; and Tessera's peak memory at two corpus sizes, to show it does not grow with the corpus.

Corpus. Generated here: documents made of Debian fortunes (concatenations of 1-8 random fortunes, so lengths vary
from tens of bytes to a few KB), written as zstd-compressed JSONL (`{"text", "id"}` per line, in 8 files) and as
Parquet (8 files, row groups of 10,000, zstd pages); sizes are of the uncompressed JSONL. Tokenizer: a GPT-2 style
byte-level BPE (vocab 8,192) trained by HF tokenizers on the fortunes; concat_tokens 2048, eos_text <|endoftext|>,
zstd shards (LLM Foundry's pretraining settings).

- Tessera: `build/bin/convert_text_to_mds --input DIR --concat-tokens 2048 --eos-text '<|endoftext|>' --workers N`
  (N = all cores) over the whole corpus in each format, at two sizes (--small-gb and --gb): wall time, MB/s of
  uncompressed JSONL, and peak resident memory (the child's ru_maxrss).
- LLM Foundry (in ~/.cache/tessera/venv-composer): its convert_dataset_json() (scripts/data_prep/convert_dataset_json
  .py: datasets' JSON builder, ConcatTokensDataset, one process) over the first --peer-mb of the corpus as plain
  JSONL (its `datasets` has no zstd codec installed), and convert_dataset_hf's build_hf_dataset() + build_dataloader()
  + MDSWriter (what scripts/data_prep/convert_dataset_hf.py runs, with its default loader workers = cores) over
  Parquet files holding the same documents; each timed as one process from start to exit, as a user runs it. Tessera
  converts the same slices; the ratio is Tessera MB/s / LLM Foundry MB/s. Foundry's JSON output on the slice is
  compared with Tessera's byte for byte.

    python benchmarks/convert_vs_llmfoundry.py [--gb 2] [--small-gb 0.5] [--peer-mb 64]
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin"))
COMPOSER_PY = pathlib.Path(os.environ.get("TESSERA_COMPOSER_PYTHON", pathlib.Path(os.environ.get(
    "TESSERA_HOME", pathlib.Path.home() / ".cache" / "tessera")) / "venv-composer" / "bin" / "python"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")
FILES = 8

FOUNDRY_JSON = """
import sys
from llmfoundry.command_utils.data_prep.convert_dataset_json import convert_dataset_json
convert_dataset_json(path=sys.argv[1], out_root=sys.argv[2], compression="zstd", concat_tokens=2048, split="train",
                     tokenizer=sys.argv[3], eos_text="<|endoftext|>")
"""
FOUNDRY_HF = """
import os, sys
from llmfoundry.command_utils.data_prep.convert_dataset_hf import (ConcatMode, build_dataloader, build_hf_dataset,
                                                                   generate_samples)
from streaming import MDSWriter
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[3])
tok.model_max_length = int(1e30)
ds = build_hf_dataset(dataset_name=sys.argv[1], split="train", mode=ConcatMode.CONCAT_TOKENS, max_length=2048,
                      eos_text="<|endoftext|>", tokenizer=tok)
loader = build_dataloader(dataset=ds, batch_size=512, num_workers=None)
with MDSWriter(columns={"tokens": "ndarray:int32"}, out=os.path.join(sys.argv[2], "train"), compression="zstd") as out:
    for sample in generate_samples(loader):
        out.write(sample)
"""


def fortunes():
    docs = []
    for p in sorted(FORTUNES.iterdir()):
        if p.is_file() and not p.suffix and not p.is_symlink():
            docs += [d for d in p.read_text(errors="replace").split("\n%\n") if d.strip()]
    return docs


def documents(pool, seed):
    rng = random.Random(seed)
    i = 0
    while True:
        yield i, "\n\n".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))
        i += 1


def write_corpus(folder, pool, megabytes, seed=0):
    """zstd JSONL and Parquet of the same documents; returns the uncompressed JSONL bytes."""
    (folder / "jsonl").mkdir(parents=True)
    (folder / "parquet").mkdir()
    per_file = megabytes * 1e6 / FILES
    total = 0
    gen = documents(pool, seed)
    for f in range(FILES):
        rows, size = [], 0
        with pa.CompressedOutputStream(str(folder / "jsonl" / f"part-{f:03d}.jsonl.zst"), "zstd") as out:
            while size < per_file:
                i, text = next(gen)
                line = (json.dumps({"text": text, "id": i}) + "\n").encode()
                out.write(line)
                size += len(line)
                rows.append({"text": text, "id": i})
        pq.write_table(pa.Table.from_pylist(rows), folder / "parquet" / f"part-{f:03d}.parquet", row_group_size=10000,
                       compression="zstd")
        total += size
    return total


def write_slice(folder, pool, megabytes):
    """The first `megabytes` of the same generator as plain JSONL and as Parquet (for the peer)."""
    (folder / "parquet").mkdir(parents=True)
    rows, size = [], 0
    gen = documents(pool, 0)
    with open(folder / "slice.jsonl", "w") as out:
        while size < megabytes * 1e6:
            i, text = next(gen)
            line = json.dumps({"text": text, "id": i}) + "\n"
            out.write(line)
            size += len(line.encode())
            rows.append({"text": text, "id": i})
    pq.write_table(pa.Table.from_pylist(rows), folder / "parquet" / "train-00000.parquet", row_group_size=10000)
    return size


WRAP = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "sys.stderr.write('\\nPEAK_RSS_KIB %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.exit(p.returncode)")


def timed(cmd, env=None):
    """Wall seconds and the peak resident memory (MiB) of one process, run under a fresh wrapper whose only child it
    is (so ru_maxrss of the wrapper's children is this process's)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAP] + [str(c) for c in cmd], capture_output=True, text=True,
                          env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr[-3000:]}")
    peak = int(proc.stderr.rsplit("PEAK_RSS_KIB ", 1)[1].split()[0])
    return seconds, peak / 1024, proc


def tessera(src, out, tok_dir, workers):
    shutil.rmtree(out, ignore_errors=True)
    return timed([BIN / "convert_text_to_mds", "--input", src, "--output", out, "--tokenizer", tok_dir,
                  "--concat-tokens", 2048, "--eos-text", "<|endoftext|>", "--workers", workers, "--progress", "off"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--small-gb", type=float, default=0.5)
    ap.add_argument("--peer-mb", type=float, default=64)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tessera-convert-bench-"))
    rows = []
    try:
        pool = fortunes()
        from tokenizers import ByteLevelBPETokenizer
        from transformers import PreTrainedTokenizerFast
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(pool, vocab_size=8192, min_frequency=2, special_tokens=["<|endoftext|>"])
        tok.save(str(work / "tokenizer.json"))
        PreTrainedTokenizerFast(tokenizer_file=str(work / "tokenizer.json"),
                                eos_token="<|endoftext|>").save_pretrained(work / "tok")

        # Tessera alone at two corpus sizes: throughput and peak memory.
        for gb in sorted({args.small_gb, args.gb}):
            corpus = work / f"corpus_{gb}"
            t0 = time.perf_counter()
            raw = write_corpus(corpus, pool, gb * 1000)
            print(f"corpus {gb} GB: {raw / 1e6:.0f} MB of JSONL written in {time.perf_counter() - t0:.0f} s",
                  flush=True)
            for fmt in ("jsonl", "parquet"):
                on_disk = sum(p.stat().st_size for p in (corpus / fmt).iterdir())
                secs, peak, proc = tessera(corpus / fmt, work / "out", work / "tok", args.workers)
                rows.append({"case": f"tessera {fmt}{'.zst' if fmt == 'jsonl' else ''} {raw / 1e9:.2f} GB",
                             "unit": "MB/s", "tessera": round(raw / 1e6 / secs, 1), "peers": {},
                             "corpus_mb": round(raw / 1e6), "input_file_mb": round(on_disk / 1e6),
                             "seconds": round(secs, 1), "mb_per_s": round(raw / 1e6 / secs, 1),
                             "peak_rss_mib": round(peak), "workers": args.workers})
                print(json.dumps(rows[-1]), proc.stdout.strip().replace("\n", "; "), flush=True)
            shutil.rmtree(corpus)

        # The peers on a slice, and Tessera on the same slice.
        sl = work / "slice"
        raw = write_slice(sl, pool, args.peer_mb)
        if not COMPOSER_PY.exists():
            print(f"{COMPOSER_PY} missing: LLM Foundry not measured (tools/setup_composer.sh)")
        else:
            env = dict(os.environ, HF_DATASETS_CACHE=str(work / "hf_cache"), HF_HUB_OFFLINE="1")
            for name, script, src, mine in (
                    ("convert_dataset_json (JSONL)", FOUNDRY_JSON, sl / "slice.jsonl", sl / "slice.jsonl"),
                    ("convert_dataset_hf (Parquet)", FOUNDRY_HF, sl / "parquet", sl / "parquet")):
                out = work / "foundry_out"
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(work / "hf_cache", ignore_errors=True)
                f_secs, f_peak, _ = timed([COMPOSER_PY, "-c", script, src, out, work / "tok"], env=env)
                t_secs, t_peak, _ = tessera(mine, work / "out", work / "tok", args.workers)
                same = None
                if "json" in name:
                    want = {p.name: p.read_bytes() for p in out.iterdir()}
                    got = {p.name: p.read_bytes() for p in (work / "out" / "train").iterdir()}
                    same = want == got
                rows.append({"case": f"{raw / 1e6:.0f} MB slice: LLM Foundry {name}", "unit": "MB/s",
                             "tessera": round(raw / 1e6 / t_secs, 1),
                             "peers": {f"LLM Foundry {name.split(' ')[0]}": round(raw / 1e6 / f_secs, 2)},
                             "corpus_mb": round(raw / 1e6),
                             "foundry_seconds": round(f_secs, 1), "foundry_mb_per_s": round(raw / 1e6 / f_secs, 2),
                             "foundry_peak_rss_mib": round(f_peak),
                             "tessera_seconds": round(t_secs, 2), "tessera_mb_per_s": round(raw / 1e6 / t_secs, 1),
                             "tessera_over_foundry": round(f_secs / t_secs, 1), "bytes_equal": same})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bench_json.emit("convert_vs_llmfoundry", rows, workers=args.workers)


if __name__ == "__main__":
    main()
