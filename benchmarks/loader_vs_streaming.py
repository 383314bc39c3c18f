"""Loader throughput: Tessera's TokenBatchLoader against mosaicml-streaming's StreamingDataset reading the same local
MDS shards (LLM Foundry's format: `tokens` as ndarray:int32, 2048 tokens per sample, zstd), one full epoch each,
measured in the same run. Streaming is iterated directly (no DataLoader processes), Tessera with its worker threads;
MB/s counts int32 token bytes delivered.

    python benchmarks/loader_vs_streaming.py [--samples 20000] [--workers 2] [--rounds 3]
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import time

import bench_json

import numpy as np
from streaming import MDSWriter, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = os.environ.get("TESSERA_LOADER_BIN", str(ROOT / "build" / "bin" / "bench_loader_throughput"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = pathlib.Path(tmp) / "data"
        rng = np.random.default_rng(0)
        with MDSWriter(out=str(data), columns={"tokens": "ndarray:int32"}, compression="zstd") as w:
            for _ in range(args.samples):
                w.write({"tokens": rng.integers(0, 50000, size=2048, dtype=np.int32)})
        # Both read decompressed shards: warm the local raw files once.
        clean_stale_shared_memory()
        for _ in StreamingDataset(local=str(data), batch_size=8):
            pass
        ours, theirs = [], []
        for _ in range(args.rounds):
            out = subprocess.run([BENCH, "--data", str(data), "--workers", str(args.workers)], capture_output=True,
                                 text=True, check=True)
            ours.append(json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"])
            clean_stale_shared_memory()
            t0 = time.perf_counter()
            n = 0
            for sample in StreamingDataset(local=str(data), batch_size=8):
                n += sample["tokens"].shape[0] > 0
            theirs.append(n / (time.perf_counter() - t0))
        o, t = statistics.median(ours), statistics.median(theirs)
        mb = 2048 * 4 / 1e6
        print(f"{args.samples} samples x 2048 int32 tokens, zstd shards, median of {args.rounds} epochs")
        print(f"{'loader':<32}{'samples/s':>12}{'MB/s':>10}")
        print(f"{'Tessera (' + str(args.workers) + ' worker threads)':<32}{o:>12.0f}{o * mb:>10.0f}")
        print(f"{'mosaicml-streaming (iterated)':<32}{t:>12.0f}{t * mb:>10.0f}")
        print(f"ratio {o / t:.1f}x")
        bench_json.emit("loader_vs_streaming",
                        [{"case": f"{args.samples} x 2048 tokens, zstd", "unit": "samples/s", "tessera": o,
                          "peers": {"mosaicml-streaming": t}, "mb_per_s": o * mb, "workers": args.workers,
                          "rounds": args.rounds}],
                        title="MDS loader (CPU): Tessera vs mosaicml-streaming")


if __name__ == "__main__":
    main()
