"""Azure Blob Storage throughput on the tests' loopback Blob service (tests/compat/azure_server.py, in a process of its
own, checking every Shared Key signature with azure-storage-blob's code), measured in one run:

- download of a shard set (default 16 objects x 64 MB): Tessera's storage layer (azure://: its own Blob client, 16 MiB
  ranges, 8 in flight per object) against azure-storage-blob's `download_blob().readinto()` as mosaicml-streaming's
  Azure downloader calls it (defaults: one connection), and with `max_concurrency=8`;
- upload of the same set: Tessera (16 MiB blocks in parallel, one Put Block List) against `upload_blob` as
  Streaming's Azure uploader calls it (defaults), and with `max_concurrency=8`.

Every client talks to the same Python server process, whose own speed caps every figure alike; the ratios are what the
benchmark reports.

    python benchmarks/storage_vs_azure.py [--objects 16] [--mb 64] [--rounds 3]
"""
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import bench_json
from storage_bench import ROOT, arguments, loopback_server, make_shards, tessera

sys.path.insert(0, str(ROOT / "tests" / "compat"))
from azure_server import connection_string, tessera_env  # noqa: E402


def main():
    from azure.storage.blob import BlobServiceClient

    args = arguments()
    with loopback_server("azure_server.py") as (url,):
        env = tessera_env(url)
        client = BlobServiceClient.from_connection_string(connection_string(url))
        container = client.create_container("bench")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            src = tmp / "src"
            total_mb = make_shards(src, args.objects, args.mb)
            for p in sorted(src.iterdir()):
                with open(p, "rb") as f:
                    container.upload_blob(f"set/{p.name}", f, max_concurrency=8)
            runs = {k: [] for k in ("ours", "sdk", "sdk8", "up_ours", "up_sdk", "up_sdk8")}
            for r in range(args.rounds):
                out = tmp / "out"
                shutil.rmtree(out, ignore_errors=True)
                os.sync()  # each timed phase starts with no dirty pages of the one before (untimed)
                runs["ours"].append(tessera(env, "download", "azure://bench/set/", out))
                for key, concurrency in (("sdk", 1), ("sdk8", 8)):
                    shutil.rmtree(out, ignore_errors=True)
                    out.mkdir()
                    os.sync()
                    t0 = time.perf_counter()
                    for i in range(args.objects):
                        with open(out / f"{i}", "wb") as f:
                            container.download_blob(f"set/shard.{i:05d}.mds",
                                                    max_concurrency=concurrency).readinto(f)
                    runs[key].append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                runs["up_ours"].append(tessera(env, "upload", src, f"azure://bench/up{r}"))
                for key, concurrency in (("up_sdk", 1), ("up_sdk8", 8)):
                    t0 = time.perf_counter()
                    for p in sorted(src.iterdir()):
                        with open(p, "rb") as f:
                            container.upload_blob(f"{key}{r}/{p.name}", f, overwrite=True, max_concurrency=concurrency)
                    runs[key].append(total_mb / (time.perf_counter() - t0))
                for prefix in (f"up{r}/", f"up_sdk{r}/", f"up_sdk8{r}/"):  # the server keeps blobs in memory
                    for blob in container.list_blobs(name_starts_with=prefix):
                        container.delete_blob(blob.name)
    m = {k: statistics.median(v) for k, v in runs.items()}
    case = f"{args.objects} x {args.mb} MiB"
    print(f"{case} on the loopback Blob service, median of {args.rounds} rounds (MB/s)")
    print(f"{'':<46}{'download':>10}{'upload':>10}")
    print(f"{'Tessera (azure://)':<46}{m['ours']:>10.0f}{m['up_ours']:>10.0f}")
    print(f"{'azure-storage-blob, defaults (as Streaming)':<46}{m['sdk']:>10.0f}{m['up_sdk']:>10.0f}")
    print(f"{'azure-storage-blob, max_concurrency=8':<46}{m['sdk8']:>10.0f}{m['up_sdk8']:>10.0f}")
    print(f"download: {m['ours'] / m['sdk']:.2f}x the SDK as Streaming calls it, {m['ours'] / m['sdk8']:.2f}x with 8 "
          f"connections; upload: {m['up_ours'] / m['up_sdk']:.2f}x, {m['up_ours'] / m['up_sdk8']:.2f}x")
    bench_json.emit("storage_vs_azure",
                    [{"case": f"download {case}", "unit": "MB/s", "tessera": m["ours"],
                      "peers": {"azure-storage-blob (Streaming)": m["sdk"], "azure-storage-blob x8": m["sdk8"]},
                      "rounds": args.rounds},
                     {"case": f"upload {case}", "unit": "MB/s", "tessera": m["up_ours"],
                      "peers": {"azure-storage-blob (Streaming)": m["up_sdk"], "azure-storage-blob x8": m["up_sdk8"]},
                      "rounds": args.rounds}],
                    title="Object storage on a loopback Azure Blob service: Tessera vs azure-storage-blob")


if __name__ == "__main__":
    main()
