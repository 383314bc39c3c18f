"""Runs `tessera_compat_driver train-trace` as the ranks of one job on this machine, for the tests that compare
Tessera's multi-rank training with PyTorch's (test_sharded_vs_pytorch.py, test_tensor_parallel_vs_pytorch.py)."""
import json
import os
import socket
import subprocess


def rank_env(rank, world, port):
    """torchrun's variables for rank `rank` of a one-node job of `world` ranks."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def run_driver_ranks(driver_path, recipe, out_root, world, what, timeout=120):
    """`train-trace RECIPE` on `world` ranks, rank r writing to out_root/rank{r}; returns ([out dir per rank],
    [trace.json per rank], the ranks' output joined). Fails naming `what` and the rank when one exits non-zero."""
    # The rendezvous port is bound here and its listening socket handed to rank 0's store, as `train --master-port 0`
    # does (TESSERA_MASTER_LISTEN_FD), so no other process can take it in between.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    procs, outs = [], []
    for rank in range(world):
        out = out_root / f"rank{rank}"
        out.mkdir(parents=True, exist_ok=True)
        outs.append(out)
        env = {**os.environ, **rank_env(rank, world, port), "OMP_NUM_THREADS": "1"}
        fds = ()
        if rank == 0:
            env["TESSERA_MASTER_LISTEN_FD"] = str(listener.fileno())
            fds = (listener.fileno(),)
        procs.append(subprocess.Popen([driver_path, "train-trace", str(recipe), str(out)], env=env, pass_fds=fds,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    listener.close()
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"{what} rank {rank} failed ({p.returncode}):\n" + "\n".join(logs)
    return outs, [json.loads((out / "trace.json").read_text()) for out in outs], "\n".join(logs)
