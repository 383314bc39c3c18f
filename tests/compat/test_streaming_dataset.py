"""Tessera's StreamingDataset against mosaicml-streaming's (the real peer) on MDS streams written by Streaming:

- the epoch arrangement (node, rank, worker, batch, element) equals Streaming's generate_work_random_batching for the
  same streams (proportion / repeat / choose / epoch_size), seed, shuffle, canonical nodes, world shape, epoch and
  resumption point, including elastic resumes (relaxed partition with another initial node count);
- at world size 1, iterating Streaming's StreamingDataset yields the samples in Tessera's order, and so does resuming
  it from a mid-epoch state_dict.
"""
import json

import numpy as np
import pytest
from streaming import MDSWriter, Stream, StreamingDataset
from streaming.base.batching.random import generate_work_random_batching
from streaming.base.util import clean_stale_shared_memory
from streaming.base.world import World


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    rng = np.random.default_rng(0)
    dirs = []
    for s, n in enumerate([137, 61, 250]):
        d = root / f"s{s}"
        with MDSWriter(out=str(d), columns={"id": "int", "tokens": "ndarray:int32"}, size_limit=700) as w:
            for i in range(n):
                w.write({"id": s * 10000 + i, "tokens": rng.integers(0, 100, size=int(rng.integers(1, 40)), dtype=np.int32)})
        dirs.append(str(d))
    return dirs


def python_dataset(streams_spec, batch_size, shuffle, seed, algo, block, ncn, partition, epoch_size):
    clean_stale_shared_memory()
    return StreamingDataset(streams=[Stream(**s) for s in streams_spec], batch_size=batch_size, shuffle=shuffle,
                            shuffle_seed=seed, shuffle_algo=algo, shuffle_block_size=block, num_canonical_nodes=ncn,
                            partition_algo=partition, epoch_size=epoch_size)


def tessera_epoch(driver, tmp_path, spec):
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    driver("streaming-epoch", tmp_path / "spec.json", tmp_path / "out.json")
    return json.loads((tmp_path / "out.json").read_text())


WEIGHTINGS = [
    lambda d: [{"local": d[0]}, {"local": d[1]}, {"local": d[2]}],
    lambda d: [{"local": d[0], "proportion": 0.5}, {"local": d[1], "proportion": 0.3}, {"local": d[2], "proportion": 0.2}],
    lambda d: [{"local": d[0], "repeat": 2.5}, {"local": d[1], "choose": 20}, {"local": d[2]}],
]


@pytest.mark.parametrize("weighting", range(len(WEIGHTINGS)))
def test_epoch_arrangement_matches_streaming(streams, driver, tmp_path, weighting):
    rng = np.random.default_rng(weighting)
    for trial in range(8):
        ncn = int(rng.choice([1, 2, 4]))
        nodes = int(rng.choice([d for d in (1, 2, 4) if d % ncn == 0 or ncn % d == 0]))
        ranks, workers, batch = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 6))
        algo = str(rng.choice(["py1e", "py1s", "py1br", "naive"]))
        seed, block, epoch = int(rng.integers(0, 10**6)), int(rng.integers(16, 400)), int(rng.integers(0, 3))
        epoch_size = int(rng.integers(100, 600)) if weighting == 1 and trial % 2 else None
        shuffle = bool(trial % 4 != 3)
        spec_streams = WEIGHTINGS[weighting](streams)
        ds = python_dataset(spec_streams, batch, shuffle, seed, algo, block, ncn, "relaxed", epoch_size)
        sample_in_epoch = int(rng.integers(0, ds.epoch_size // 2)) if trial % 2 else 0
        initial_p = 0
        if trial % 3 == 2:  # elastic resume from a run on another node count
            initial_p = int(rng.choice([d for d in (1, 2, 4) if (nodes * ranks * batch) % (d * ranks) == 0]))
            ds.initial_physical_nodes = initial_p
        theirs = generate_work_random_batching(ds, World(nodes, ranks, workers, 0), epoch, sample_in_epoch)
        ours = tessera_epoch(driver, tmp_path, {
            "streams": spec_streams, "batch_size": batch, "shuffle": shuffle, "seed": seed, "algo": algo,
            "block": block, "ncn": ncn, "partition": "relaxed", "epoch_size": epoch_size, "nodes": nodes,
            "ranks": ranks, "workers": workers, "epoch": epoch, "sample_in_epoch": sample_in_epoch,
            "initial_p": initial_p})
        assert ours["shape"] == list(theirs.shape), (weighting, trial)
        assert ours["ids"] == theirs.flatten().tolist(), (weighting, trial)


def test_iteration_and_resumption_match_streaming(streams, driver, tmp_path):
    spec_streams = WEIGHTINGS[1](streams)
    args = dict(batch_size=4, shuffle=True, seed=17, algo="py1e", block=64, ncn=1, partition="relaxed",
                epoch_size=None)
    ds = python_dataset(spec_streams, **args)
    for epoch in range(2):
        got = [int(s["id"]) for s in ds]  # one pass = one epoch at world size 1
        ours = tessera_epoch(driver, tmp_path, {"streams": spec_streams, "batch_size": 4, "shuffle": True, "seed": 17,
                                                "algo": "py1e", "block": 64, "ncn": 1, "partition": "relaxed",
                                                "epoch_size": None, "nodes": 1, "ranks": 1, "workers": 1,
                                                "epoch": epoch, "sample_in_epoch": 0, "initial_p": 0})
        assert got == [v for v in ours["ids_field"] if v != -1], epoch
    # Resume mid-epoch 0 from Streaming's own state_dict: the rest of the epoch, in Tessera's order.
    ds = python_dataset(spec_streams, **args)
    ds.load_state_dict({"epoch": 0, "sample_in_epoch": 100, "num_canonical_nodes": 1, "shuffle_seed": 17,
                        "initial_physical_nodes": 1})
    got = [int(s["id"]) for s in ds]
    ours = tessera_epoch(driver, tmp_path, {"streams": spec_streams, "batch_size": 4, "shuffle": True, "seed": 17,
                                            "algo": "py1e", "block": 64, "ncn": 1, "partition": "relaxed",
                                            "epoch_size": None, "nodes": 1, "ranks": 1, "workers": 1, "epoch": 0,
                                            "sample_in_epoch": 100, "initial_p": 1})
    assert got == [v for v in ours["ids_field"] if v != -1]
