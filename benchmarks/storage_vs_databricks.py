"""Unity Catalog volume throughput on the tests' loopback Databricks workspace (tests/compat/databricks_server.py, in
a process of its own), measured in one run:

- download of a shard set (default 16 objects x 64 MB): Tessera's storage layer (dbfs:/Volumes: the Files API, 16 MiB
  ranges, 8 in flight per file) against databricks-sdk's `files.download()` as mosaicml-streaming's Unity Catalog
  downloader calls it (its default files client: a presigned URL per file);
- upload of the same set: Tessera (above 50 MiB a multipart upload, 16 MiB parts to presigned URLs, 8 in flight,
  from the mapped file) against `files.upload()` as Streaming's uploader calls it (the SDK's default files client:
  10 MiB parts to presigned URLs).

Both clients talk to the same Python server process, whose own speed caps every figure alike; the ratios are what
the benchmark reports.

    python benchmarks/storage_vs_databricks.py [--objects 16] [--mb 64] [--rounds 3]
"""
import os
import pathlib
import shutil
import sys
import tempfile
import time

from storage_bench import ROOT, arguments, loopback_server, make_shards, report, tessera


def main():
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.config import Config

    args = arguments()
    compat = ROOT / "tests" / "compat"
    with loopback_server("databricks_server.py", "main.bench.v") as (url,):
        sys.path.insert(0, str(compat))
        from databricks_server import DatabricksServer

        env = DatabricksServer.env(type("Workspace", (), {"url": url, "token": "dapi-tessera-test-token"}))
        files = WorkspaceClient(config=Config(host=url, token="dapi-tessera-test-token")).files
        volume = "/Volumes/main/bench/v"
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            src = tmp / "src"
            total_mb = make_shards(src, args.objects, args.mb)
            for p in sorted(src.iterdir()):
                with open(p, "rb") as f:
                    files.upload(f"{volume}/set/{p.name}", f, overwrite=True)
            ours, sdk, up_ours, up_sdk = [], [], [], []
            for r in range(args.rounds):
                out = tmp / "out"
                shutil.rmtree(out, ignore_errors=True)
                os.sync()  # each timed phase starts with no dirty pages of the one before (untimed)
                ours.append(tessera(env, "download", f"dbfs:{volume}/set/", out))
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                os.sync()
                t0 = time.perf_counter()
                for i in range(args.objects):
                    contents = files.download(f"{volume}/set/shard.{i:05d}.mds").contents
                    with open(out / f"{i}", "wb") as f:
                        shutil.copyfileobj(contents, f, 1 << 20)
                sdk.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                up_ours.append(tessera(env, "upload", src, f"dbfs:{volume}/up{r}"))
                t0 = time.perf_counter()
                for p in sorted(src.iterdir()):
                    with open(p, "rb") as f:
                        files.upload(f"{volume}/upsdk{r}/{p.name}", f, overwrite=True)
                up_sdk.append(total_mb / (time.perf_counter() - t0))
                for prefix in (f"up{r}", f"upsdk{r}"):  # the server keeps files in memory
                    for p in sorted(src.iterdir()):
                        files.delete(f"{volume}/{prefix}/{p.name}")
    report("storage_vs_databricks",
           "Unity Catalog volumes on a loopback workspace: Tessera vs databricks-sdk",
           "a loopback Databricks workspace", args,
           "Tessera (dbfs:/Volumes)", "databricks-sdk", "databricks-sdk (as Streaming)",
           "databricks-sdk", ours, sdk, up_ours, up_sdk)

if __name__ == "__main__":
    main()
