#!/usr/bin/env python3
"""Checks Tessera's layer order from the #include lines: a layer includes its own headers and those of lower layers,
never a higher layer's (docs/architecture.md, "Layers"). Layers of the same rank (algorithms, callbacks, loggers) do
not include each other either.

    tools/check_layers.py [--root DIR]

Prints one line per violation ("src/util/x.cpp:12: util includes tessera/trainer/trainer.h (trainer is above
util)") and exits 1 when there is any; exits 0 and prints a summary otherwise. A folder under include/tessera/,
src/include/tessera/ or src/ that is not in the table below is a violation too, so a new layer must be placed deliberately.
"""
import argparse
import pathlib
import re
import sys

# Lowest first. Layers on one line share a rank and are independent of each other.
LAYERS = [
    ["util"],
    ["config"],
    ["storage"],
    ["data"],
    ["models"],
    ["optim"],
    ["distributed"],
    ["checkpoint"],
    ["eval"],
    ["core"],
    ["algorithms", "callbacks", "loggers"],
    ["trainer"],
    ["planner", "serve"],
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
INCLUDE = re.compile(r'^\s*#\s*include\s+"tessera/([a-z_]+)/([^"]+)"')
SOURCES = (".h", ".hpp", ".cpp", ".cc")


def layer_files(root: pathlib.Path):
    """(layer, path) for every source file of a layer: include/tessera/<layer>/** (public headers),
    src/include/tessera/<layer>/** (internal headers) and src/<layer>/**."""
    internal = root / "src" / "include"
    for base in (root / "include" / "tessera", internal / "tessera", root / "src"):
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix in SOURCES and path.is_file() and not (base == root / "src" and internal in path.parents):
                yield path.relative_to(base).parts[0], path


def check(root: pathlib.Path):
    problems, files = [], 0
    for layer, path in layer_files(root):
        rel = path.relative_to(root)
        if layer not in RANK:
            problems.append(f"{rel}: folder '{layer}' is not a layer (add it to tools/check_layers.py and "
                            "docs/architecture.md)")
            continue
        files += 1
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or m.group(1) == layer:
                continue
            target = m.group(1)
            if target not in RANK:
                problems.append(f"{rel}:{number}: {layer} includes tessera/{target}/{m.group(2)}: '{target}' is not a "
                                "layer")
            elif RANK[target] > RANK[layer]:
                problems.append(f"{rel}:{number}: {layer} includes tessera/{target}/{m.group(2)} ({target} is above "
                                f"{layer})")
            elif RANK[target] == RANK[layer]:
                problems.append(f"{rel}:{number}: {layer} includes tessera/{target}/{m.group(2)} ({target} and "
                                f"{layer} are independent layers of one rank)")
    return problems, files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path,
                        help="the checkout to check (default: this script's)")
    args = parser.parse_args()
    problems, files = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layer violation(s)", file=sys.stderr)
        return 1
    print(f"layers: {files} files follow the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
