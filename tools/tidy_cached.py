#!/usr/bin/env python3
"""clang-tidy over the files of a compile database, with a cache of clean results (tools/tidy.sh; docs/testing.md).

A file's result depends on the clang-tidy binary, .clang-tidy, its compile command and the text of every file it
includes. The key of a file hashes all of these (the includes listed by the compiler's -M, each file's bytes hashed
once per run); a file that was clean under the same key before is not checked again. Files with findings are never
cached, so they are reported on every run. clang-tidy walks LibTorch's whole AST for every file (~10 s each); listing
a file's includes takes well under one.

The cache keys name our files relative to the checkout and the build tree, so a fresh clone elsewhere (CI's) reuses
the results of this one.

Usage: tidy_cached.py --build DIR --filter REGEX [--cache DIR] [-j N]
Exit status: 0 when every file is clean, 1 on findings (printed), 2 on a usage or tool error.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

SOURCE = pathlib.Path(__file__).resolve().parent.parent
FINDING = re.compile(r"(warning|error): ")


def preprocess_args(command: str) -> list:
    """The compile command turned into one that lists the file's includes (-M) instead of compiling it."""
    args = shlex.split(command)
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "-MF", "-MT", "-MQ"):
            i += 2
            continue
        if a in ("-c", "-MD", "-MMD", "-Winvalid-pch"):
            i += 1
            continue
        # CMake's precompiled header for clang: -Xclang -include-pch -Xclang X.pch -Xclang -include -Xclang X.hxx.
        # Listing includes reads the header itself instead.
        if a == "-Xclang" and i + 3 < len(args) and args[i + 1] == "-include-pch":
            i += 4
            continue
        if a == "-Xclang" and i + 3 < len(args) and args[i + 1] == "-include" and args[i + 2] == "-Xclang":
            out += ["-include", args[i + 3]]
            i += 4
            continue
        out.append(a)
        i += 1
    return out + ["-M"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="build tree with compile_commands.json and its PCH built")
    ap.add_argument("--filter", required=True, help="regex over the files' absolute paths")
    home = os.environ.get("TESSERA_HOME", os.path.expanduser("~/.cache/tessera"))
    ap.add_argument("--cache", default=os.path.join(home, "tidy-cache"), help="cache directory ('' for none)")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    db = json.loads(pathlib.Path(args.build, "compile_commands.json").read_text())
    entries = [e for e in db if re.search(args.filter, e["file"])]
    if not entries:
        print(f"tidy_cached.py: no file of {args.build}/compile_commands.json matches {args.filter}", file=sys.stderr)
        return 2
    version = subprocess.run(["clang-tidy", "--version"], capture_output=True, text=True, check=True).stdout
    base = hashlib.sha256((version + (SOURCE / ".clang-tidy").read_text()).encode()).hexdigest()
    cache = pathlib.Path(args.cache) if args.cache else None
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
        # Keys not used for 30 days are dropped.
        for old in cache.iterdir():
            if old.stat().st_mtime < time.time() - 30 * 86400:
                old.unlink(missing_ok=True)

    hashes = {}
    # The checkout as this script sees it (symbolic links resolved) and as CMake saw it (the path it was given, which
    # keeps them): a clone under a linked directory, as CI's may be, names itself both ways, and a key that kept
    # either would miss in every other clone. Longest first, so that neither is replaced inside the other.
    roots = {str(SOURCE)}
    for line in pathlib.Path(args.build, "CMakeCache.txt").read_text().splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            roots.add(line.split("=", 1)[1])
    roots = sorted(roots, key=len, reverse=True)

    def relative(text: str) -> str:
        for root in roots:
            text = text.replace(root, "<checkout>")
        return text

    def file_hash(path: str) -> str:
        h = hashes.get(path)
        if h is None:
            try:
                data = pathlib.Path(path).read_bytes()
                if any(path.startswith(root + os.sep) for root in roots):  # generated files (the PCH's header)
                    data = relative(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
                h = hashlib.sha256(data).hexdigest()
            except OSError:
                h = "missing"
            hashes[path] = h
        return h

    def includes(e) -> list:
        """The files the translation unit reads (absolute paths), or None when the compiler cannot list them."""
        r = subprocess.run(preprocess_args(e["command"]), cwd=e["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        deps = set(r.stdout.replace("\\\n", " ").split(":", 1)[1].split())
        return [os.path.normpath(os.path.join(e["directory"], d)) for d in deps]

    def key(e) -> str:
        deps = includes(e)
        if deps is None:
            return ""  # cannot list its includes: check it
        h = hashlib.sha256((base + relative(e["command"])).encode())
        for d in sorted(deps, key=relative):
            h.update(f"\0{relative(d)}\0{file_hash(d)}".encode())
        return h.hexdigest()

    def check(e):
        k = key(e) if cache else ""
        if k and (cache / k).exists():
            os.utime(cache / k)
            return e["file"], True, ""
        r = subprocess.run(["clang-tidy", "-p", args.build, "-quiet", e["file"]], capture_output=True, text=True)
        out = r.stdout + r.stderr
        clean = r.returncode == 0 and not FINDING.search(r.stdout)
        if clean and k:
            (cache / k).touch()
        return e["file"], False, "" if clean else out

    findings = []
    cached = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.j) as pool:
        for path, hit, out in pool.map(check, entries):
            cached += hit
            if out:
                findings.append((path, out))
    for path, out in findings:
        print(f"== {path}\n{out}")
    print(f"tidy_cached.py: {len(entries)} files, {cached} clean in the cache, {len(findings)} with findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
