"""Checkpoint saves to object storage on a loopback S3-API server (moto's server mode, as in the tests), in one run:

- Tessera: an mpt-125m training state (fp32 weights + AdamW state, one rank) saved with `save_folder: s3://...`
  (bench_checkpoint_io --remote): the synchronous save's total time (snapshot, multipart upload from memory,
  metadata.json, `latest`), and with async saves every step the time a step blocks per save and the upload's time in
  the background;
- boto3: the same bytes (the rank file Tessera uploaded, downloaded first) written from memory with the transfer
  manager (upload_fileobj, default TransferConfig: 10 threads, 8 MB parts), best and median of the same rounds.

Goal (issue 19): a save's upload at least as fast as boto3's for the same bytes, and async saves blocking a step only
for the copy to host memory. The single-process server on a small machine caps both clients alike.

    python benchmarks/checkpoint_s3_vs_boto3.py [--seq-len 128] [--rounds 3]
"""
import argparse
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import bench_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "compat"))
from s3_server import MotoServer  # noqa: E402

BENCH = os.environ.get("TESSERA_CHECKPOINT_BIN", str(ROOT / "build" / "bin" / "bench_checkpoint_io"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = MotoServer()
    try:
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "tessera.json"
            proc = subprocess.run([BENCH, "--remote", "s3://bench/ckpt", "--seq-len", str(args.seq_len), "--rounds",
                                   str(args.rounds), "--dir", str(pathlib.Path(tmp) / "work"), "--json", str(out)],
                                  env={**server.env(), **bench_json.TUNED_MALLOC}, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"bench_checkpoint_io --remote failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            print(proc.stdout, end="")
            ours = json.loads(out.read_text())
        from boto3.s3.transfer import TransferConfig

        body = s3.get_object(Bucket="bench", Key="ckpt/ep0-ba4/rank0.safetensors")["Body"].read()
        assert len(body) == ours["bytes"], (len(body), ours["bytes"])
        boto = []
        for r in range(args.rounds):
            t0 = time.perf_counter()
            s3.upload_fileobj(io.BytesIO(body), "bench", f"boto/{r}/rank0.safetensors", Config=TransferConfig())
            boto.append(time.perf_counter() - t0)
            s3.delete_object(Bucket="bench", Key=f"boto/{r}/rank0.safetensors")  # the server keeps objects in memory
    finally:
        server.stop()
    mb = ours["bytes"] / 1e6
    t_best, t_med = ours["sync_best_seconds"], ours["sync_median_seconds"]
    b_best, b_med = min(boto), statistics.median(boto)
    print(f"{mb:.0f} MB checkpoint on a loopback moto server, best (median) of {args.rounds} rounds")
    print(f"  Tessera save to s3:// (snapshot + upload + metadata + latest): {t_best:.2f} s ({t_med:.2f}), "
          f"{mb / t_best:.0f} MB/s")
    print(f"  boto3 upload_fileobj of the same bytes:                        {b_best:.2f} s ({b_med:.2f}), "
          f"{mb / b_best:.0f} MB/s")
    print(f"  Tessera / boto3 throughput: {b_best / t_best:.2f}x (goal >= 1)")
    print(f"  async: a step blocks {ours['async_blocking_seconds']:.3f} s per save "
          f"({100 * ours['async_blocking_seconds'] / ours['step_seconds']:.1f}% of a {ours['step_seconds']:.2f} s "
          f"step); the upload takes {ours['async_background_seconds']:.2f} s in the background")
    bench_json.emit("checkpoint_s3_vs_boto3",
                    [{"case": f"save {mb:.0f} MB to S3", "unit": "MB/s", "tessera": mb / t_best,
                      "peers": {"boto3 upload_fileobj": mb / b_best}, "rounds": args.rounds,
                      "median": mb / t_med, "peer_median": mb / b_med}],
                    title="Checkpoint save to a loopback S3 server: Tessera vs boto3 writing the same bytes",
                    checkpoint_bytes=ours["bytes"], async_blocking_seconds=ours["async_blocking_seconds"],
                    async_background_seconds=ours["async_background_seconds"], step_seconds=ours["step_seconds"])


if __name__ == "__main__":
    main()
