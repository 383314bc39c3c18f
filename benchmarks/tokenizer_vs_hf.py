"""Tokenizer encode throughput: Tessera against Hugging Face `tokenizers` on the same text (the Debian fortunes corpus,
every document encoded separately, no special tokens), both single-threaded (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false; HF through encode_batch so Python call overhead is not counted per document), measured
in the same run. The tokenizers are GPT-2 style byte-level BPE trained by HF on the corpus; ids are checked equal.

    python benchmarks/tokenizer_vs_hf.py [--vocab-size 8192] [--rounds 5] [--style gpt2|llama3]
"""
import argparse
import json
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import bench_json  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = os.environ.get("TESSERA_TOKENIZER_BENCH", str(ROOT / "build" / "bin" / "bench_tokenizer_throughput"))
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(ROOT / "build" / "bin" / "tessera_compat_driver"))
sys.path.insert(0, str(ROOT / "tests" / "compat"))
import test_tokenizer_hf as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--style", choices=["gpt2", "llama3"], default="gpt2")
    args = ap.parse_args()
    docs = T.read_fortunes()
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    tok = T.train_gpt2(docs, args.vocab_size) if args.style == "gpt2" else T.train_llama3(docs)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "tokenizer.json"
        tok.save(str(path))
        hf = Tokenizer.from_file(str(path))  # fresh: empty word cache
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            enc = hf.encode_batch(docs, add_special_tokens=False)
            times.append(time.perf_counter() - t0)
        ntok = sum(len(e.ids) for e in enc)
        out = subprocess.run([BENCH, "--tokenizer", str(path), "--input", str(T.FORTUNES), "--rounds",
                              str(args.rounds)], capture_output=True, text=True, check=True)
        ours = json.loads(out.stdout.strip().splitlines()[-1])
        assert ours["tokens"] == ntok and ours["bytes"] == nbytes, (ours, ntok, nbytes)
    hf_first, hf_med = times[0], statistics.median(times)
    print(f"{len(docs)} fortunes documents, {nbytes / 1e6:.2f} MB, {ntok} tokens, {args.style}-style byte-level BPE "
          f"vocab {tok.get_vocab_size()}, single thread, median of {args.rounds} rounds (first round: cold cache)")
    print(f"{'tokenizer':<28}{'MB/s':>8}{'Mtok/s':>9}{'first MB/s':>12}")
    print(f"{'Tessera':<28}{ours['mb_per_s']:>8.1f}{ours['tokens_per_s'] / 1e6:>9.2f}"
          f"{nbytes / 1e6 / ours['first_round_s']:>12.1f}")
    print(f"{'HF tokenizers (encode_batch)':<28}{nbytes / 1e6 / hf_med:>8.1f}{ntok / hf_med / 1e6:>9.2f}"
          f"{nbytes / 1e6 / hf_first:>12.1f}")
    print(f"ratio {ours['mb_per_s'] / (nbytes / 1e6 / hf_med):.1f}x (first round "
          f"{(nbytes / ours['first_round_s']) / (nbytes / hf_first):.1f}x)")
    bench_json.emit("tokenizer_vs_hf",
                    [{"case": f"{args.style} BPE, vocab {tok.get_vocab_size()}", "unit": "MB/s",
                      "tessera": ours["mb_per_s"], "peers": {"HF tokenizers (encode_batch)": nbytes / 1e6 / hf_med},
                      "first_round_mb_per_s": nbytes / 1e6 / ours["first_round_s"],
                      "peer_first_round_mb_per_s": nbytes / 1e6 / hf_first, "rounds": args.rounds}],
                    title="Tokenizer encode (one thread): Tessera vs HF tokenizers")


if __name__ == "__main__":
    main()
