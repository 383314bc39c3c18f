"""Checkpoint saves to object storage on a loopback S3-API server (moto's server mode, as in the tests), in one run:

- Tessera: an mpt-125m training state (fp32 weights + AdamW state, one rank) saved with `save_folder: s3://...`
  (bench_checkpoint_io --remote): the synchronous save's total time (snapshot, multipart upload from memory,
  metadata.json, `latest`), and with async saves every step the time a step blocks per save and the upload's time in
  the background;
- boto3: the same bytes (the rank file Tessera uploaded, downloaded first) written from memory with the transfer
  manager (upload_fileobj, default TransferConfig: 10 threads, 8 MB parts), best and median of the same rounds.

The server (one Python process on the same cores) is the bottleneck of both clients and its speed drifts during a run,
so boto3's rounds run between two of Tessera's runs (the first times half the synchronous saves, the second the rest
and the async saves), and the report gives the server's CPU seconds per GB received from each client.

Goal (issue 19): a save's upload at least as fast as boto3's for the same bytes, and async saves blocking a step only
for the copy to host memory. The single-process server on a small machine caps both clients alike.

    python benchmarks/checkpoint_s3_vs_boto3.py [--seq-len 128] [--layers 12] [--rounds 3] [--async-steps 4]
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


def server_cpu_seconds(pid):
    """The server process's user + system CPU time so far (/proc/PID/stat, in clock ticks)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12, help="the model's layers (mpt-125m's 12; fewer: a smaller state)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--async-steps", type=int, default=4, help="steps of the run with an async save after each")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    server = MotoServer()
    try:
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        from boto3.s3.transfer import TransferConfig

        boto, boto_cpu = [], []

        def boto_round(body):
            r = len(boto)
            c0, t0 = server_cpu_seconds(server.proc.pid), time.perf_counter()
            s3.upload_fileobj(io.BytesIO(body), "bench", f"boto/{r}/rank0.safetensors", Config=TransferConfig())
            boto.append(time.perf_counter() - t0)
            s3.delete_object(Bucket="bench", Key=f"boto/{r}/rank0.safetensors")  # the server keeps objects in memory
            # With the delete, as Tessera's runs remove theirs.
            boto_cpu.append(server_cpu_seconds(server.proc.pid) - c0)

        # The server is the bottleneck of both clients (one Python process on the same two cores) and its speed drifts
        # during a run, so boto3's rounds come between two runs of Tessera's: the first times half the synchronous
        # saves, the second the rest and then the async saves.
        ours = {"sync_seconds": []}
        with tempfile.TemporaryDirectory() as tmp:
            def tessera_run(prefix, rounds, async_steps):
                """Runs bench_checkpoint_io --remote; returns the server's CPU seconds over the run."""
                out = pathlib.Path(tmp) / "tessera.json"
                c0 = server_cpu_seconds(server.proc.pid)
                proc = subprocess.run([BENCH, "--remote", f"s3://bench/{prefix}", "--seq-len", str(args.seq_len),
                                       "--layers", str(args.layers), "--rounds", str(rounds), "--async-steps",
                                       str(async_steps), "--dir", str(pathlib.Path(tmp) / "work"), "--json", str(out)],
                                      env={**server.env(), **bench_json.TUNED_MALLOC}, capture_output=True, text=True)
                cpu = server_cpu_seconds(server.proc.pid) - c0
                if proc.returncode != 0:
                    sys.exit(f"bench_checkpoint_io --remote failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
                print(proc.stdout, end="")
                got = json.loads(out.read_text())
                ours.update({k: v for k, v in got.items() if k != "sync_seconds"})
                ours["sync_seconds"] += got["sync_seconds"]
                return cpu

            # The first run trains one step, saves at its end (untimed) and then in its timed rounds: the server's
            # CPU over it, per GB, is comparable with boto3's rounds.
            first_rounds = (args.rounds + 1) // 2
            tessera_cpu = tessera_run("first", first_rounds, 0)
            body = s3.get_object(Bucket="bench", Key="first/ep0-ba1/rank0.safetensors")["Body"].read()
            assert len(body) == ours["bytes"], (len(body), ours["bytes"])
            for key in [o["Key"] for o in s3.list_objects_v2(Bucket="bench", Prefix="first/").get("Contents", [])]:
                s3.delete_object(Bucket="bench", Key=key)
            for _ in range(args.rounds):
                boto_round(body)
            del body
            tessera_run("ckpt", args.rounds - first_rounds, args.async_steps)
    finally:
        server.stop()
    mb = ours["bytes"] / 1e6
    t_best, t_med = min(ours["sync_seconds"]), statistics.median(ours["sync_seconds"])
    b_best, b_med = min(boto), statistics.median(boto)
    # The server's CPU per GB received: over Tessera's first run (its saves and their removals) and over boto3's
    # rounds (uploads and deletes).
    t_cpu_gb, b_cpu_gb = tessera_cpu / ((1 + first_rounds) * mb / 1e3), sum(boto_cpu) / (len(boto) * mb / 1e3)
    print(f"{mb:.0f} MB checkpoint on a loopback moto server, best (median) of {args.rounds} rounds")
    print(f"  Tessera save to s3:// (snapshot + upload + metadata + latest): {t_best:.2f} s ({t_med:.2f}), "
          f"{mb / t_best:.0f} MB/s")
    print(f"  boto3 upload_fileobj of the same bytes:                        {b_best:.2f} s ({b_med:.2f}), "
          f"{mb / b_best:.0f} MB/s")
    print(f"  Tessera / boto3 throughput: {b_best / t_best:.2f}x best, {b_med / t_med:.2f}x median (goal >= 1)")
    print(f"  the server's CPU per GB received: {t_cpu_gb:.1f} s from Tessera, {b_cpu_gb:.1f} s from boto3 (it is "
          f"the bottleneck of both)")
    extra = {}
    if args.async_steps >= 2:
        print(f"  async: a step blocks {ours['async_blocking_seconds']:.3f} s per save "
              f"({100 * ours['async_blocking_seconds'] / ours['step_seconds']:.1f}% of a {ours['step_seconds']:.2f} s "
              f"step); the upload takes {ours['async_background_seconds']:.2f} s in the background")
        extra = {k: ours[k] for k in ("async_blocking_seconds", "async_background_seconds", "step_seconds")}
    bench_json.emit("checkpoint_s3_vs_boto3",
                    [{"case": f"save {mb:.0f} MB to S3", "unit": "MB/s", "tessera": mb / t_best,
                      "peers": {"boto3 upload_fileobj": mb / b_best}, "rounds": args.rounds,
                      "median": mb / t_med, "peer_median": mb / b_med, "server_cpu_s_per_gb": t_cpu_gb,
                      "peer_server_cpu_s_per_gb": b_cpu_gb}],
                    title="Checkpoint save to a loopback S3 server: Tessera vs boto3 writing the same bytes",
                    checkpoint_bytes=ours["bytes"], **extra)


if __name__ == "__main__":
    main()
