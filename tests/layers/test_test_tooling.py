"""The test tiers' own tooling (docs/testing.md#no-silent-skips): tools/ci_report.py must fail a run with an
unexpected skip or a failure and pass one whose skips are all listed, and tests/strict_skips.py must fail a pytest
session with a skip under TESSERA_NO_SKIPS=1 and let it pass without; tests/streaming_shm.py must keep a second
process's use of Streaming's shared memory waiting until the test using it has ended."""
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]


def junit(tmp_path, cases):
    """A ctest-style JUnit file: (name, status) with status run | fail | notrun."""
    body = []
    for name, status in cases:
        inner = {"fail": "<failure message=\"Failed\"/>", "notrun": "<skipped message=\"Skipped\"/>"}.get(status, "")
        body.append(f'<testcase name="{name}" classname="{name}" time="1.5" status="{status}">{inner}</testcase>')
    path = tmp_path / "junit.xml"
    path.write_text(f'<?xml version="1.0"?><testsuite name="t" tests="{len(cases)}">{"".join(body)}</testsuite>')
    return path


def report(tmp_path, cases, expected):
    skips = tmp_path / "expected_skips.txt"
    skips.write_text(expected)
    return subprocess.run([sys.executable, ROOT / "tools" / "ci_report.py", "--junit", junit(tmp_path, cases),
                           "--expected-skips", skips], capture_output=True, text=True)


def test_report_passes_listed_skips_and_fails_others(tmp_path):
    listed = "DistWorker.*  always  workers\n"
    ok = report(tmp_path, [("A.B", "run"), ("DistWorker.X", "notrun")], listed)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "skipped as expected, 1: DistWorker.*" in ok.stdout
    bad = report(tmp_path, [("A.B", "run"), ("Compat.Gone", "notrun")], listed)
    assert bad.returncode == 1
    assert "1 unexpected skip(s)" in bad.stdout and "Compat.Gone" in bad.stdout
    failed = report(tmp_path, [("A.B", "fail")], listed)
    assert failed.returncode == 1 and "FAILED: A.B" in failed.stdout
    assert "slowest 15 entries" in ok.stdout


def test_strict_skips_plugin_fails_a_session_with_a_skip(tmp_path):
    (tmp_path / "test_x.py").write_text("import pytest\n\ndef test_a():\n    pytest.skip('peer missing')\n")
    run = lambda strict: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "strict_skips", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT / "tests"), "TESSERA_NO_SKIPS": "1" if strict else "0", "PATH": "/usr/bin:/bin"})
    strict = run(True)
    assert strict.returncode == 1, strict.stdout
    assert "strict_skips: 1 test(s) skipped" in strict.stdout and "peer missing" in strict.stdout
    lax = run(False)
    assert lax.returncode == 0, lax.stdout


def test_streaming_shm_plugin_orders_the_tests_that_use_streamings_shared_memory(tmp_path):
    """Two pytest processes, as ctest runs two peer suites: the holder builds a StreamingDataset, says so, and ends 2 s
    later; the waiter, started meanwhile, calls clean_stale_shared_memory() (which would unlink the holder's names) and
    builds a dataset on the same directory (which Streaming refuses while the holder's is registered). Both must wait
    for the holder's test to end. The lock is the real machine-wide one, so the peer suites running beside this test
    are ordered with it too."""
    from streaming import MDSWriter

    with MDSWriter(out=str(tmp_path / "mds"), columns={"x": "int"}) as w:
        for i in range(4):
            w.write({"x": i})
    (tmp_path / "test_shm.py").write_text(textwrap.dedent("""
        import os, pathlib, time
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        D = pathlib.Path(os.environ["SHM_TEST_DIR"])

        def test_holder():
            ds = StreamingDataset(local=str(D / "mds"), batch_size=1)
            assert [int(s["x"]) for s in ds] == [0, 1, 2, 3]
            (D / "held").touch()
            time.sleep(2)
            (D / "released").touch()

        def test_waiter():
            while not (D / "held").exists():
                time.sleep(0.01)
            clean_stale_shared_memory()
            assert (D / "released").exists(), "clean_stale_shared_memory ran while the holder's test was running"
            ds = StreamingDataset(local=str(D / "mds"), batch_size=1)
            assert [int(s["x"]) for s in ds] == [0, 1, 2, 3]
    """))
    env = {"PYTHONPATH": str(ROOT / "tests"), "SHM_TEST_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "streaming_shm",
                               "-k", role, str(tmp_path / "test_shm.py")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
             for role in ("holder", "waiter")]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
