"""Object-storage throughput on a loopback S3-API server (moto's server mode, as in the tests), measured in one run:

- download of a shard set (default 16 objects x 64 MB, ~1 GB): Tessera's storage layer (parallel byte ranges per
  object) against boto3's transfer manager (download_file, default TransferConfig: 10 threads, 8 MB parts) and
  against mosaicml-streaming's S3 downloader (what StreamingDataset uses for every shard);
- upload of the same set: Tessera (parallel multipart) against boto3's upload_file;
- both again through Arrow's C++ S3FileSystem (pyarrow.fs, the libarrow Tessera links for Parquet and for gs://),
  copying each object to or from a local file with pyarrow.fs.copy_files in 8 MiB chunks (its default, 1 MiB,
  makes a ranged GET per MiB and is slower still): issue 67 asks to keep whichever of
  Arrow's S3 client and Tessera's own is faster.

Goal (issue 19): at least 2x Streaming's download rate and at least boto3's. All three clients talk to the same
server process, so its own speed caps every figure alike; the ratios are what the benchmark reports.

    python benchmarks/storage_vs_boto3.py [--objects 16] [--mb 64] [--rounds 3]
"""
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import bench_json
from storage_bench import ROOT, arguments, make_shards, tessera

sys.path.insert(0, str(ROOT / "tests" / "compat"))
from s3_server import MotoServer  # noqa: E402


def main():
    args = arguments()
    server = MotoServer()
    try:
        for k, v in server.env().items():  # Streaming's downloader reads the environment
            if k.startswith("AWS_") or k == "S3_ENDPOINT_URL":
                os.environ[k] = v
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            src = tmp / "src"
            total_mb = make_shards(src, args.objects, args.mb)
            for p in sorted(src.iterdir()):
                s3.upload_file(str(p), "bench", f"set/{p.name}")
            from boto3.s3.transfer import TransferConfig
            from streaming.base.storage.download import CloudDownloader

            import pyarrow.fs as pafs

            arrow = pafs.S3FileSystem(access_key=server.access_key_id, secret_key=server.secret_access_key,
                                      endpoint_override=server.url, region="us-east-1", scheme="http")
            local = pafs.LocalFileSystem()
            ours, boto, streaming, up_ours, up_boto, arrow_down, arrow_up = [], [], [], [], [], [], []
            for r in range(args.rounds):
                out = tmp / "out"
                shutil.rmtree(out, ignore_errors=True)
                ours.append(tessera(server.env(), "download", "s3://bench/set/", out))
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                t0 = time.perf_counter()
                for i in range(args.objects):
                    s3.download_file("bench", f"set/shard.{i:05d}.mds", str(out / f"{i}"), Config=TransferConfig())
                boto.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                out.mkdir()
                downloader = CloudDownloader.get("s3://bench/set")
                t0 = time.perf_counter()
                for i in range(args.objects):
                    downloader.download(f"s3://bench/set/shard.{i:05d}.mds", str(out / f"{i}"), 60)
                streaming.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                out.mkdir()
                t0 = time.perf_counter()
                for i in range(args.objects):
                    pafs.copy_files(f"bench/set/shard.{i:05d}.mds", str(out / f"{i}"), source_filesystem=arrow,
                                    destination_filesystem=local, chunk_size=8 << 20)
                arrow_down.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                up_ours.append(tessera(server.env(), "upload", src, f"s3://bench/up{r}"))
                t0 = time.perf_counter()
                for p in sorted(src.iterdir()):
                    s3.upload_file(str(p), "bench", f"upboto{r}/{p.name}", Config=TransferConfig())
                up_boto.append(total_mb / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                for p in sorted(src.iterdir()):
                    pafs.copy_files(str(p), f"bench/uparrow{r}/{p.name}", source_filesystem=local,
                                    destination_filesystem=arrow, chunk_size=8 << 20)
                arrow_up.append(total_mb / (time.perf_counter() - t0))
                for prefix in (f"up{r}/", f"upboto{r}/", f"uparrow{r}/"):  # the server keeps objects in memory
                    for obj in s3.list_objects_v2(Bucket="bench", Prefix=prefix).get("Contents", []):
                        s3.delete_object(Bucket="bench", Key=obj["Key"])
    finally:
        server.stop()
    o, b, s = statistics.median(ours), statistics.median(boto), statistics.median(streaming)
    uo, ub = statistics.median(up_ours), statistics.median(up_boto)
    ad, au = statistics.median(arrow_down), statistics.median(arrow_up)
    case = f"{args.objects} x {args.mb} MiB"
    print(f"{case} on a loopback moto server, median of {args.rounds} rounds (MB/s)")
    print(f"{'':<34}{'download':>10}{'upload':>10}")
    print(f"{'Tessera':<34}{o:>10.0f}{uo:>10.0f}")
    print(f"{'boto3 transfer manager':<34}{b:>10.0f}{ub:>10.0f}")
    print(f"{'mosaicml-streaming S3Downloader':<34}{s:>10.0f}{'':>10}")
    print(f"{'Arrow S3FileSystem (C++)':<34}{ad:>10.0f}{au:>10.0f}")
    print(f"download: {o / s:.2f}x Streaming (goal >= 2), {o / b:.2f}x boto3 (goal >= 1), {o / ad:.2f}x Arrow; "
          f"upload: {uo / ub:.2f}x boto3, {uo / au:.2f}x Arrow")
    bench_json.emit("storage_vs_boto3",
                    [{"case": f"download {case}", "unit": "MB/s", "tessera": o,
                      "peers": {"boto3 transfer manager": b, "mosaicml-streaming": s, "Arrow S3FileSystem": ad},
                      "rounds": args.rounds},
                     {"case": f"upload {case}", "unit": "MB/s", "tessera": uo,
                      "peers": {"boto3 transfer manager": ub, "mosaicml-streaming": None, "Arrow S3FileSystem": au},
                      "rounds": args.rounds}],
                    title="Object storage on a loopback S3 server: Tessera vs boto3 and Streaming")


if __name__ == "__main__":
    main()
