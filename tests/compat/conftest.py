"""Shared helpers for the compatibility tests: paths to Tessera's binaries, a runner for the model driver, and a
Hugging Face hub cache holding the config.json of the models LLM Foundry's fine-tuning recipes name."""
import json
import os
import pathlib
import subprocess

import pytest

# No test reaches a network. huggingface_hub reads this once, at import (before any test module imports
# transformers): without it, from_pretrained(..., local_files_only=True) still tries the hub for optional files such
# as adapter_config.json, and waits on each connection's timeout (about 45 s per test here).
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = pathlib.Path(__file__).resolve().parents[2]


def transformers_major():
    """The major version of this venv's transformers (4 in the main venv, 5 in venv-tf5), without importing it."""
    from importlib.metadata import version
    return int(version("transformers").split(".")[0])


def _binary(env, name):
    path = os.environ.get(env, str(ROOT / "build" / "bin" / name))
    if not pathlib.Path(path).exists():
        pytest.fail(f"{path} does not exist: build the tests first (cmake --preset test && cmake --build build)")
    return path


def write_sequence_mds(out, samples, seq, vocab, seed=0):
    """An MDS split at `out` of `samples` samples of seq + 1 int32 tokens: arithmetic progressions mod `vocab` with a
    random start and stride (1-5), which a tiny model learns within a few steps."""
    import numpy as np
    from streaming import MDSWriter

    rng = np.random.default_rng(seed)
    with MDSWriter(out=str(out), columns={"tokens": "ndarray:int32"}, size_limit=4000) as w:
        for _ in range(samples):
            start, stride = rng.integers(0, vocab), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(seq + 1)) % vocab).astype(np.int32)})


@pytest.fixture(scope="session")
def driver():
    path = _binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver")

    def run(*args):
        # An export is written for this venv's transformers, as its user would ask (config.json's rotary settings in
        # transformers 4's keys here; the product's default is transformers 5's rope_parameters).
        if args and args[0] == "export" and transformers_major() < 5 and "transformers4" not in args:
            args = (*args, "transformers4")
        proc = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"tessera_compat_driver {' '.join(map(str, args))} failed:\n{proc.stderr}")
        return proc

    return run


@pytest.fixture(scope="session")
def driver_path():
    """The path of tessera_compat_driver, for tests that start it themselves (one process per rank)."""
    return _binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver")


# config.json of the hub models the fine-tuning recipes in recipes/ start from (as published), and of the main job's
# export that recipes/sft-tiny-cpu.yaml fine-tunes (a GPT-2 layout, since that MPT has learned positions; n_positions
# 1024 instead of 128, so that the recipe tests' max_seq_len override of 512 fits): tests/data/hub_configs/, shared
# with the unit tests (tests/unit/test_util.h), so that recipes naming them resolve and plan without the weights
# (tests/compat/hub_cache.py builds the cache).


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A hub cache (HF_HUB_CACHE layout: models--org--name/refs/main -> snapshots/REV/) with the configs of
    tests/data/hub_configs/org--name.json, and a folder main-job-export/ holding main-job-export.json."""
    from hub_cache import make_hub_cache

    return make_hub_cache(tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server process on loopback with signature checking on (tests/compat/s3_server.py)."""
    from s3_server import MotoServer

    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, request):
    """A new, empty bucket on the test server, named after the test."""
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-" + str(os.getpid() % 10000)
    s3_server.client().create_bucket(Bucket=name)
    return name
