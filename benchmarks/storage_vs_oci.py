"""OCI Object Storage throughput on the tests' loopback Object Storage service (tests/compat/oci_server.py, in a
process of its own, checking every signature with the `oci` SDK's signer), measured in one run:

- download of a shard set (default 16 objects x 64 MB): Tessera's storage layer (oci://: 16 MiB ranges, 8 in flight
  per object) against the `oci` SDK's `get_object` streamed in 4 MiB chunks, as mosaicml-streaming's OCI downloader
  reads it;
- upload of the same set: Tessera (16 MiB multipart parts, 8 in flight) against the SDK's `UploadManager.upload_file`
  as Streaming's OCI uploader calls it (its defaults: multipart above 128 MiB, parallel parts).

Both clients talk to the same Python server process, whose own speed caps every figure alike; the ratios are what the
benchmark reports.

    python benchmarks/storage_vs_oci.py [--objects 16] [--mb 64] [--rounds 3]
"""
import os
import pathlib
import shutil
import tempfile
import time

from storage_bench import arguments, loopback_server, make_shards, report, tessera


def main():
    import oci

    args = arguments()
    with loopback_server("oci_server.py", "bench") as (url, config_file):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OCI_")}
        env.update(OCI_CONFIG_FILE=config_file, TESSERA_OCI_ENDPOINT_URL=url)
        client = oci.object_storage.ObjectStorageClient(oci.config.from_file(config_file), service_endpoint=url)
        manager = oci.object_storage.UploadManager(client)
        ns = client.get_namespace().data
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            src = tmp / "src"
            total_mb = make_shards(src, args.objects, args.mb)
            for p in sorted(src.iterdir()):
                manager.upload_file(ns, "bench", f"set/{p.name}", str(p))
            ours, sdk, up_ours, up_sdk = [], [], [], []
            for r in range(args.rounds):
                out = tmp / "out"
                shutil.rmtree(out, ignore_errors=True)
                os.sync()  # each timed phase starts with no dirty pages of the one before (untimed)
                ours.append(tessera(env, "download", "oci://bench/set/", out))
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                os.sync()
                t0 = time.perf_counter()
                for i in range(args.objects):
                    details = client.get_object(ns, "bench", f"set/shard.{i:05d}.mds")
                    with open(out / f"{i}", "wb") as f:
                        for chunk in details.data.raw.stream(2048 ** 2, decode_content=False):
                            f.write(chunk)
                sdk.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                up_ours.append(tessera(env, "upload", src, f"oci://bench/up{r}"))
                t0 = time.perf_counter()
                for p in sorted(src.iterdir()):
                    manager.upload_file(ns, "bench", f"upsdk{r}/{p.name}", str(p))
                up_sdk.append(total_mb / (time.perf_counter() - t0))
                for prefix in (f"up{r}/", f"upsdk{r}/"):  # the server keeps objects in memory
                    for p in sorted(src.iterdir()):
                        client.delete_object(ns, "bench", f"{prefix}{p.name}")
    report("storage_vs_oci",
           "OCI Object Storage on a loopback service: Tessera vs the oci SDK",
           "a loopback OCI Object Storage service", args,
           "Tessera (oci://)", "oci SDK", "oci SDK (as Streaming)",
           "the oci SDK", ours, sdk, up_ours, up_sdk)

if __name__ == "__main__":
    main()
