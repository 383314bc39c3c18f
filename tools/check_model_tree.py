#!/usr/bin/env python3
"""Checks the model tree's two boundaries (docs/architecture.md, "Key contracts"; docs/models.md), rules as data:

1. Family facts stay in their family's folder: a family is a folder src/models/<family>/ with a family.cpp, and its
   names are the recipe names and HF model_types its sources register (family.cpp, or the key table family.cpp
   registers). No file outside that folder names one of
   them, as a string literal or through a family's own types (MPTOptions, LlamaForCausalLMImpl, ...): not the rest
   of Tessera, not the shared blocks, not another family's folder.
2. Model code knows nothing about distribution: no file of the model tree calls a collective or a tensor/context-
   parallel primitive, or names a communicator or process group.

    tools/check_model_tree.py [--root DIR] [--dump]

The tree meets both rules, so ALLOWED (a per-file allowance, the ratchet that got it there) is empty: any finding
fails with one line ("src/trainer/train_config.cpp:88: family name \"mixtral\" outside its family folder"); a file
with fewer findings than an allowance fails too, naming the allowance to lower. Exit 0 with a summary otherwise.
"""
import argparse
import json
import pathlib
import re
import sys

# Every name a family could be known by: the HF model_types of transformers' default configs (checked in beside the
# tests) and the recipe names that are not model_types. Each belongs to the family folder whose sources register it;
# one no folder registers may appear nowhere in the tree.
MODEL_TYPES_FILE = "tests/data/hf_default_configs/transformers-4.57.6.json"
RECIPE_NAMES = ["mpt_causal_lm", "gemma"]
# Keys of one family's configuration, by family (MPT's and DBRX's sub-configs, its expert-parallel degree): code
# outside its folder that reads or writes them knows that family.
FAMILY_KEYS = {"mpt": ["attn_config", "ffn_config", "moe_world_size"]}
# A family's own types: an options struct, a module or its causal LM, named outside the family's folder.
FAMILY_TYPE = re.compile(r"\b(?:MPT|Llama|Falcon|Gemma|GPTNeoX|GPTNeo|OPT|Phi3|Dbrx|DBRX)\w*(?:Options|Impl|ForCausalLM)"
                         r"\b")
# What model code must not call or name (rule 2).
PARALLEL = re.compile(r"\b(?:all_reduce|all_gather\w*|reduce_scatter\w*|all_to_all\w*|broadcast|barrier|"
                      r"column_parallel|row_parallel|sequence_parallel\w*|TensorParallelGroup|Communicator|"
                      r"ProcessGroup\w*|c10d)\b")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
SOURCES = (".h", ".hpp", ".cpp", ".cc")

# Findings a file may have, per file: {"family": n, "parallel": n}. Empty: the tree meets both rules, and any finding
# fails (the ratchet that brought the family facts into src/models/<family>/ and the collectives into distributed/).
ALLOWED = {}


def all_names(root: pathlib.Path):
    types = json.loads((root / MODEL_TYPES_FILE).read_text())
    return set(types) | set(RECIPE_NAMES) | {k for keys in FAMILY_KEYS.values() for k in keys}


def family_folders(root: pathlib.Path):
    """{folder name: the names its sources register (and its FAMILY_KEYS)}, for each folder with a family.cpp."""
    names = all_names(root)
    out = {}
    for spec in sorted((root / "src" / "models").glob("*/family.cpp")):
        family = spec.parent.name
        out[family] = set(FAMILY_KEYS.get(family, []))
        for path in sorted(spec.parent.iterdir()):
            if path.suffix not in SOURCES:
                continue
            text = "\n".join(strip_comment(line) for line in path.read_text(encoding="utf-8").splitlines())
            out[family] |= {m.group(1) for m in STRING.finditer(text) if m.group(1) in names}
    return out


def sources(root: pathlib.Path):
    for base in ("include/tessera", "src"):  # src/ holds src/include/tessera/ (internal headers) too
        for path in sorted((root / base).rglob("*")):
            if path.suffix in SOURCES and path.is_file():
                yield path


def in_models(rel: str):
    return rel.startswith(("src/models/", "include/tessera/models/", "src/include/tessera/models/"))


def family_of(rel: str, folders):
    parts = rel.split("/")
    if len(parts) > 3 and parts[0] == "src" and parts[1] == "models" and parts[2] in folders:
        return parts[2]
    return None


def strip_comment(line: str):
    # Good enough for this code base: no "//" inside the string literals these rules look at.
    i = line.find("//")
    return line if i < 0 else line[:i]


def findings(root: pathlib.Path):
    """(rel, line, kind, text) for every finding in the tree."""
    names = all_names(root)
    folders = family_folders(root)
    owner = {name: family for family, own in folders.items() for name in own}
    out = []
    for path in sources(root):
        rel = path.relative_to(root).as_posix()
        family = family_of(rel, folders)
        for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            line = strip_comment(raw)
            if raw.lstrip().startswith("#include"):
                continue
            if in_models(rel):
                for m in PARALLEL.finditer(line):
                    out.append((rel, number, "parallel", f"{m.group(0)} in model code"))
            for m in STRING.finditer(line):
                name = m.group(1)
                if name not in names or (family is not None and owner.get(name) == family):
                    continue
                what = "family key" if any(name in keys for keys in FAMILY_KEYS.values()) else "family name"
                whose = f" (family {owner[name]})" if name in owner else " (no family folder registers it)"
                out.append((rel, number, "family", f'{what} "{name}"{whose} outside its family folder'))
            if family is None:
                for m in FAMILY_TYPE.finditer(line):
                    out.append((rel, number, "family", f"family type {m.group(0)} outside its family folder"))
    return out


def check(root: pathlib.Path, allowed=None):
    allowed = ALLOWED if allowed is None else allowed
    found = findings(root)
    counts = {}
    for rel, _, kind, _ in found:
        counts.setdefault(rel, {}).setdefault(kind, 0)
        counts[rel][kind] += 1
    problems = []
    for rel, number, kind, text in found:
        if counts[rel][kind] > allowed.get(rel, {}).get(kind, 0):
            problems.append(f"{rel}:{number}: {text} (allowed here: {allowed.get(rel, {}).get(kind, 0)} {kind}, "
                            f"found {counts[rel][kind]})")
    for rel, kinds in sorted(allowed.items()):
        for kind, n in sorted(kinds.items()):
            have = counts.get(rel, {}).get(kind, 0)
            if have < n:
                problems.append(f"{rel}: {have} {kind} finding(s), fewer than its allowance of {n}: lower ALLOWED in "
                                "tools/check_model_tree.py to match")
    return problems, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent)
    ap.add_argument("--dump", action="store_true", help="print today's findings as an ALLOWED table and exit")
    args = ap.parse_args()
    if args.dump:
        _, counts = check(args.root, allowed={})
        for rel in sorted(counts):
            print(f'    "{rel}": {json.dumps(counts[rel])},')
        return 0
    problems, counts = check(args.root)
    for p in problems:
        print(p)
    if problems:
        return 1
    total = {k: sum(c.get(k, 0) for c in counts.values()) for k in ("family", "parallel")}
    print(f"model tree: within its allowances ({total['family']} family facts outside their folders, "
          f"{total['parallel']} parallel calls in models/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
