"""Hugging Face Hub throughput on the tests' loopback Hub (tests/compat/hub_server.py, in a process of its own,
following huggingface.co's protocol: LFS files redirected to a CDN host on download, uploaded through the Git LFS batch
API), measured in one run:

- download of a shard set (default 16 files x 64 MB) from a dataset repository: Tessera's storage layer (hf://, one
  stream per file) against huggingface_hub's `hf_hub_download`, as mosaicml-streaming's Hub downloader calls it;
- upload of the same set into the repository: Tessera (`upload_tree`: preupload, the LFS batch, parallel PUTs, one
  commit) against huggingface_hub's `upload_folder` (the same protocol, one commit).

Each upload sends fresh random bytes (the Hub skips objects it already holds). Both clients talk to the same Python
server process, whose own speed caps every figure alike; the ratios are what the benchmark reports.

    python benchmarks/storage_vs_hub.py [--objects 16] [--mb 64] [--rounds 3]
"""
import os
import pathlib
import shutil
import tempfile
import time

from storage_bench import arguments, loopback_server, make_shards, report, tessera


def main():
    args = arguments()
    with loopback_server("hub_server.py", "datasets/bench/shards") as (url, token):
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env.update(HF_ENDPOINT=url, HF_TOKEN=token)
        os.environ.update(HF_ENDPOINT=url, HF_TOKEN=token, HF_HUB_DISABLE_PROGRESS_BARS="1")
        os.environ.pop("HF_HUB_OFFLINE", None)
        from huggingface_hub import HfApi, hf_hub_download  # (after HF_ENDPOINT: huggingface_hub reads it on import)

        api = HfApi(endpoint=url, token=token)
        repo = dict(repo_id="bench/shards", repo_type="dataset")
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            total_mb = make_shards(tmp / "set", args.objects, args.mb)
            api.upload_folder(folder_path=tmp / "set", path_in_repo="set", **repo)
            ours, sdk, up_ours, up_sdk = [], [], [], []
            for r in range(args.rounds):
                out = tmp / "out"
                shutil.rmtree(out, ignore_errors=True)
                os.sync()  # each timed phase starts with no dirty pages of the one before (untimed)
                ours.append(tessera(env, "download", "hf://datasets/bench/shards/set/", out))
                shutil.rmtree(out, ignore_errors=True)
                os.sync()
                t0 = time.perf_counter()
                for i in range(args.objects):
                    hf_hub_download(filename=f"set/shard.{i:05d}.mds", local_dir=out, **repo)
                sdk.append(total_mb / (time.perf_counter() - t0))
                shutil.rmtree(out)
                for who in ("ours", "sdk"):
                    src = tmp / who
                    shutil.rmtree(src, ignore_errors=True)
                    make_shards(src, args.objects, args.mb)  # fresh bytes: nothing is on the Hub already
                    os.sync()
                    if who == "ours":
                        up_ours.append(tessera(env, "upload", src, f"hf://datasets/bench/shards/up{r}"))
                    else:
                        t0 = time.perf_counter()
                        api.upload_folder(folder_path=src, path_in_repo=f"upsdk{r}", **repo)
                        up_sdk.append(total_mb / (time.perf_counter() - t0))
                for prefix in (f"up{r}", f"upsdk{r}"):  # the server keeps files in memory
                    api.delete_folder(prefix, **repo)
    report("storage_vs_hub",
           "Hugging Face Hub on a loopback Hub: Tessera vs huggingface_hub",
           "a loopback Hugging Face Hub", args,
           "Tessera (hf://)", "huggingface_hub", "huggingface_hub",
           "huggingface_hub", ours, sdk, up_ours, up_sdk)


if __name__ == "__main__":
    main()
