"""Shared helpers for the compatibility tests: paths to Tessera's binaries and a runner for the model driver."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _binary(env, name):
    path = os.environ.get(env, str(ROOT / "build" / "bin" / name))
    if not pathlib.Path(path).exists():
        pytest.fail(f"{path} does not exist: build the project first (cmake --workflow --preset default)")
    return path


@pytest.fixture(scope="session")
def driver():
    path = _binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver")

    def run(*args):
        proc = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"tessera_compat_driver {' '.join(map(str, args))} failed:\n{proc.stderr}")
        return proc

    return run
