"""What the object-storage benchmarks share (storage_vs_boto3.py, storage_vs_gcs.py, storage_vs_azure.py,
storage_vs_databricks.py, storage_vs_oci.py, storage_vs_hub.py): their arguments, a set of random shards, and one transfer through
Tessera's storage layer (bench_storage_transfer) against a running server."""
import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = os.environ.get("TESSERA_STORAGE_BIN", str(ROOT / "build" / "bin" / "bench_storage_transfer"))


def arguments():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    return ap.parse_args()


@contextlib.contextmanager
def loopback_server(script, *args):
    """Runs the tests' loopback store `script` (in tests/compat) as a process of its own, yields the fields of the first
    line it prints (its URL, and a config file or token), and kills it on the way out."""
    compat = ROOT / "tests" / "compat"
    proc = subprocess.Popen([sys.executable, str(compat / script), *args], stdout=subprocess.PIPE, text=True, cwd=compat)
    try:
        yield proc.stdout.readline().split()
    finally:
        proc.kill()
        proc.wait()


def make_shards(folder, objects, mb):
    """`objects` files of `mb` MiB of random bytes in `folder`, named like MDS shards; their total in MB."""
    folder.mkdir()
    for i in range(objects):
        (folder / f"shard.{i:05d}.mds").write_bytes(os.urandom(mb << 20))
    return objects * (mb << 20) / 1e6


def tessera(env, mode, src, dst):
    """MB/s of Tessera's `mode` ("download" every object under a prefix, "upload" every file of a folder)."""
    out = subprocess.run([BENCH, mode, "--from", str(src), "--to", str(dst)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["mb_per_s"]


def report(name, title, where, args, ours_label, peer, peer_label, peer_phrase, ours, sdk, up_ours, up_sdk):
    """Prints the medians of a one-peer store benchmark (download and upload MB/s, Tessera against `peer`) and emits
    them to the suite's results as benchmark `name`."""
    import statistics

    import bench_json

    o, s = statistics.median(ours), statistics.median(sdk)
    uo, us = statistics.median(up_ours), statistics.median(up_sdk)
    case = f"{args.objects} x {args.mb} MiB"
    print(f"{case} on {where}, median of {args.rounds} rounds (MB/s)")
    print(f"{'':<40}{'download':>10}{'upload':>10}")
    print(f"{ours_label:<40}{o:>10.0f}{uo:>10.0f}")
    print(f"{peer_label:<40}{s:>10.0f}{us:>10.0f}")
    print(f"download: {o / s:.2f}x {peer_phrase}; upload: {uo / us:.2f}x")
    bench_json.emit(name,
                    [{"case": f"download {case}", "unit": "MB/s", "tessera": o, "peers": {peer: s},
                      "rounds": args.rounds},
                     {"case": f"upload {case}", "unit": "MB/s", "tessera": uo, "peers": {peer: us},
                      "rounds": args.rounds}],
                    title=title)
