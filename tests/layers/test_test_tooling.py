"""The test tiers' own tooling (docs/testing.md#no-silent-skips): tools/ci_report.py must fail a run with an
unexpected skip or a failure and pass one whose skips are all listed, and tests/strict_skips.py must fail a pytest
session with a skip under TESSERA_NO_SKIPS=1 and let it pass without."""
import pathlib
import subprocess
import sys

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
