"""Google Cloud Storage throughput on a loopback GCS emulator (fake-gcs-server, as in the tests), measured in one run:

- download of a shard set (default 16 objects x 64 MB): Tessera's storage layer (gs://: Arrow's GcsFileSystem with
  parallel 8 MiB ranges per object) against Google's Python client, google-cloud-storage (`download_to_filename`,
  which is also what mosaicml-streaming's GCS downloader calls for every shard);
- upload of the same set: Tessera (one resumable upload per object, from the mapped file) against
  `upload_from_filename`.

Both clients talk to the same emulator process, so its own speed caps every figure alike; the ratios are what the
benchmark reports.

    python benchmarks/storage_vs_gcs.py [--objects 16] [--mb 64] [--rounds 3]
"""
import pathlib
import shutil
import sys
import tempfile
import time

from storage_bench import ROOT, arguments, make_shards, report, tessera

sys.path.insert(0, str(ROOT / "tests" / "compat"))
from gcs_server import FakeGcsServer  # noqa: E402


def main():
    args = arguments()
    server = FakeGcsServer()
    try:
        client = server.client()
        bucket = client.create_bucket("bench")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            src = tmp / "src"
            total_mb = make_shards(src, args.objects, args.mb)
            for p in sorted(src.iterdir()):
                bucket.blob(f"set/{p.name}").upload_from_filename(str(p))
            ours, sdk, up_ours, up_sdk = [], [], [], []
            for r in range(args.rounds):
                out = tmp / "out"
                shutil.rmtree(out, ignore_errors=True)
                ours.append(tessera(server.env(), "download", "gs://bench/set/", out))
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                t0 = time.perf_counter()
                for i in range(args.objects):
                    bucket.blob(f"set/shard.{i:05d}.mds").download_to_filename(str(out / f"{i}"))
                sdk.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                up_ours.append(tessera(server.env(), "upload", src, f"gs://bench/up{r}"))
                t0 = time.perf_counter()
                for p in sorted(src.iterdir()):
                    bucket.blob(f"upsdk{r}/{p.name}").upload_from_filename(str(p))
                up_sdk.append(total_mb / (time.perf_counter() - t0))
                for prefix in (f"up{r}/", f"upsdk{r}/"):  # the emulator keeps objects in memory
                    for blob in client.list_blobs("bench", prefix=prefix):
                        blob.delete()
    finally:
        server.stop()
    report("storage_vs_gcs",
           "Object storage on a loopback GCS emulator: Tessera vs google-cloud-storage",
           "a loopback fake-gcs-server", args,
           "Tessera (gs://)", "google-cloud-storage", "google-cloud-storage (and Streaming)",
           "google-cloud-storage", ours, sdk, up_ours, up_sdk)

if __name__ == "__main__":
    main()
