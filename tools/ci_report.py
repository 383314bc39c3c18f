#!/usr/bin/env python3
"""Reports on one ctest run from its JUnit XML (tools/test.sh; docs/testing.md#tiers).

Prints the tier's counts and wall time, the slowest 15 entries, and every skipped entry with the reason
tests/expected_skips.txt gives for it. Exits 1 if an entry was skipped that the file does not list (for this machine:
`no-gpu` skips are expected only without a GPU), so a suite cannot disappear silently.
"""
import argparse
import fnmatch
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET


def read_expected(path):
    rules = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3 or parts[1] not in ("always", "no-gpu"):
                sys.exit(f"{path}:{n}: expected 'PATTERN always|no-gpu REASON', got {line!r}")
            rules.append((parts[0], parts[1], parts[2]))
    return rules


def have_gpu():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", required=True)
    ap.add_argument("--expected-skips", required=True)
    ap.add_argument("--tier", default="test")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--slowest", type=int, default=15)
    a = ap.parse_args()

    cases = []
    for tc in ET.parse(a.junit).getroot().iter("testcase"):
        status = tc.get("status", "run")
        if tc.find("skipped") is not None or status in ("notrun", "disabled"):
            status = "skipped"
        elif tc.find("failure") is not None or tc.find("error") is not None or status == "fail":
            status = "failed"
        else:
            status = "passed"
        cases.append((tc.get("name"), float(tc.get("time", "0") or 0), status))

    counts = {s: sum(1 for c in cases if c[2] == s) for s in ("passed", "failed", "skipped")}
    wall = f", {a.seconds:.0f} s wall ({a.seconds / 60:.1f} min)" if a.seconds is not None else ""
    print(f"\n[report] tier {a.tier}: {len(cases)} entries: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped{wall}")
    print(f"[report] slowest {a.slowest} entries (seconds; ctest ran 2 at a time, RUN_SERIAL ones alone):")
    for name, t, status in sorted(cases, key=lambda c: -c[1])[: a.slowest]:
        print(f"  {t:8.1f}  {name}{'' if status == 'passed' else '  (' + status + ')'}")
    for name, _, status in cases:
        if status == "failed":
            print(f"[report] FAILED: {name}")

    rules = read_expected(a.expected_skips)
    gpu = have_gpu()
    unexpected = []
    by_reason = {}
    for name, _, status in cases:
        if status != "skipped":
            continue
        rule = next((r for r in rules if fnmatch.fnmatchcase(name, r[0]) and (r[1] == "always" or not gpu)), None)
        if rule is None:
            unexpected.append(name)
        else:
            by_reason.setdefault(f"{rule[0]} ({rule[2]})", []).append(name)
    for reason, names in by_reason.items():
        print(f"[report] skipped as expected, {len(names)}: {reason}")
    if unexpected:
        print(f"[report] {len(unexpected)} unexpected skip(s) (not in {a.expected_skips}"
              f"{'; this machine has a GPU' if gpu else ''}): a skipped test checked nothing:")
        for name in unexpected:
            print(f"  {name}")
        return 1
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
