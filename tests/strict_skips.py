"""pytest plugin for the peer suites (tests/CMakeLists.txt loads it with -p strict_skips).

With TESSERA_NO_SKIPS=1 (the test preset and CI), a skipped test fails the session: a peer suite whose tests skip
because something is missing has not checked anything, and must say so rather than pass. Selecting no test at all
already fails (pytest's exit code 5). docs/testing.md#no-silent-skips.
"""
import os

_skipped = []


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("TESSERA_NO_SKIPS") != "1" or not _skipped:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["", f"strict_skips: {len(_skipped)} test(s) skipped, and this suite allows none "
             "(TESSERA_NO_SKIPS=1; install what they name, e.g. tools/setup_tests.sh):"]
    lines += [f"  {s}" for s in _skipped]
    for line in lines:
        if tr is not None:
            tr.write_line(line, red=True)
        else:
            print(line)
    session.exitstatus = 1
