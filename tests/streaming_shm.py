"""pytest plugin for the peer suites: one test at a time on this machine uses mosaicml-streaming's shared memory.

Streaming names its shared memory machine-wide (/dev/shm/000000_locals, 000000_epoch_shape, ...). A StreamingDataset
registers the first free prefix by looking for it and then creating it, which is not atomic; it creates more names
of that prefix while it iterates; and clean_stale_shared_memory() creates and unlinks every name of every prefix in
use, whoever's it is. So two processes that use Streaming at once can collide: CI saw `FileExistsError: [Errno 17]
File exists: '/000300_locals'` in test_streaming_dataset.py while another peer suite ran beside it (ctest runs them
two at a time), as Streaming's own issues #884 and #901 report for parallel tests.

This plugin (tests/CMakeLists.txt loads it with -p streaming_shm) makes a test's first StreamingDataset or
clean_stale_shared_memory() call take a machine-wide lock, an flock on $TMPDIR/tessera-streaming-shm.lock, and
holds it until the test has ended and its datasets are collected (their destructors unlink their names). Tests that
do not touch Streaming's datasets never wait. A test whose datasets are built in processes it starts calls hold()
first. It changes nothing Streaming computes: it only orders the tests that use it. docs/testing.md#flakes.
"""
import fcntl
import functools
import gc
import os
import tempfile

import pytest

_lock_file = None


def hold():
    """Take the lock now, until the running test ends: for a test whose Streaming datasets are built in processes it
    starts (the plugin sees only this process's calls). Without the plugin loaded, until this process exits."""
    global _lock_file
    if _lock_file is not None:
        return
    f = open(os.path.join(tempfile.gettempdir(), "tessera-streaming-shm.lock"), "a")  # noqa: SIM115 (held past here)
    fcntl.flock(f, fcntl.LOCK_EX)
    _lock_file = f


def _release():
    global _lock_file
    if _lock_file is None:
        return
    gc.collect()  # the test's datasets unlink their names before another process may register them
    fcntl.flock(_lock_file, fcntl.LOCK_UN)
    _lock_file.close()
    _lock_file = None


def _locked(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        hold()
        return fn(*args, **kwargs)

    return wrapper


def pytest_configure(config):
    try:
        import streaming.base.util as util
        from streaming.base.dataset import StreamingDataset
    except ImportError:  # a venv without Streaming has nothing to order
        return
    StreamingDataset.__init__ = _locked(StreamingDataset.__init__)
    util.clean_stale_shared_memory = _locked(util.clean_stale_shared_memory)  # whoever imports it from there later


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    try:
        yield
    finally:
        _release()
