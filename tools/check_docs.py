#!/usr/bin/env python3
"""Checks every command that README.md and docs/ show against the code, and runs those that are cheap and need no GPU,
network or data (issue 64; docs/testing.md#the-docs-commands).

    tools/check_docs.py [--root DIR] [--build DIR]

A command is a line of a fenced block marked sh, bash, shell or console (`$ ` lines only in console blocks), with
`\\` continuations joined and split at `&&`, `||`, `;` and `|`, or an inline code span that starts with one of our
programs (`tessera ...`, `build/bin/...`, `tools/...`, `benchmarks/...`, `examples/...`). For each:

- its program is ours (the `tessera` command and its subcommands, a program in BUILD/bin, a script in the checkout)
  or listed in EXTERNAL below; anything else is a problem, so a new program is added deliberately;
- a `tessera` subcommand exists, and every option it names is in that subcommand's `--help`; an option given to a
  program in BUILD/bin is in its `--help`; an option given to a script appears in the script;
- every checkout path it names (recipes/..., tools/..., a path with a folder of the checkout first) exists;
- a command RUN below matches (help, version, completion) is run from the checkout's root and must exit 0, and so is
  every `tessera train` command with a recipe of the checkout, as a plan: `--dry-run --no-preflight` added (the
  recipe, its overrides and the options are read and the run planned as shown; nothing trains, no data is needed).

Usage lines are commands too: `[--quick]` checks --quick, `train|eval` checks both subcommands, and a token with a
placeholder (`<dir>`, `...`, `$VAR`, `DIR` in capitals) is not checked as a path. Prints one line per problem
("docs/x.md:12: `tessera train --recipee r.yaml`: train has no option --recipee") and exits 1 when there is any.
"""
import argparse
import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys

# Programs that are not ours, which the docs may show (their options are not checked).
EXTERNAL = {
    "apt-get", "bash", "cat", "cd", "ccache", "clang-tidy", "cmake", "cp", "ctest", "curl", "du", "echo", "env", "export",
    "find", "git", "grep", "head", "jq", "kill", "kubectl", "ln", "ls", "mkdir", "mlflow", "mv", "nproc", "nvidia-smi",
    "perf", "pip", "python", "python3", "rm", "sbatch", "scancel", "scontrol", "sed", "sinfo", "sort", "source",
    "squeue", "srun", "ssh", "sudo", "tail", "tar", "tee", "tensorboard", "time", "torchrun", "unshare", "wandb", "wc",
    "xz", "zsh",
    # the shell's own words
    "if", "then", "else", "fi", "for", "do", "done", "while", "wait", "sleep", "[", "test", "true", "false", "exit",
}
# Commands run besides the training commands (regular expressions on the command as written, `build/bin/tessera` read
# as `tessera`).
RUN = [
    r"tessera( [a-z-]+)* --help",
    r"tessera( [a-z-]+)* --version",
    r"tessera help( [a-z-]+)?",
    r"tessera completion (bash|zsh)",
]
# Training commands not planned, each with why: their recipe reads, already when it is read, an input that an earlier
# command or the user makes (their options and paths are still checked).
NOT_PLANNED = [
    (r"recipes/sft-tiny-cpu\.yaml", "fine-tunes the main job's export, runs/mpt-tiny-cpu/hf (README's command (a))"),
    (r"variables\.model_path=/", "a model folder of the user's"),
]
# Folders of the checkout whose paths a command may name.
TOP = ("recipes", "tools", "tests", "docs", "benchmarks", "examples", "cmake", "src", "include", "fuzz", "configs")
SHELL_LANGS = {"sh", "bash", "shell", "console"}
OURS = re.compile(r"^(tessera|build/bin/\S+|tools/\S+|benchmarks/\S+|examples/\S+|tests/\S+\.(sh|py))$")
PLACEHOLDER = re.compile(r"[<>{}*$]|\.\.\.|^[A-Z][A-Z_]+$|/[A-Z][A-Z_]+(/|$)")


def doc_files(root):
    yield root / "README.md"
    yield from sorted((root / "docs").rglob("*.md"))


def commands_in(path, root):
    """(line, command text) for every command in one Markdown file."""
    rel = path.relative_to(root)
    lines = path.read_text(encoding="utf-8").splitlines()
    fence, lang, pending, start = None, "", "", 0
    prose = []  # (line, text) outside fences, for inline spans
    for number, line in enumerate(lines, 1):
        m = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
        if m and (fence is None or m.group(1).startswith(fence)):
            if fence is None:
                fence, lang = m.group(1), m.group(2).lower()
            else:
                fence = None
            continue
        if fence is None:
            prose.append((number, line))
            continue
        if lang not in SHELL_LANGS:
            continue
        text = line.strip()
        if lang == "console":
            if not text.startswith("$ "):
                continue
            text = text[2:]
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text, pending = pending + text, ""
        text = re.sub(r"(^|\s)#\s.*$", "", text).strip()  # a trailing comment
        if text:
            yield rel, start, text
    # Inline spans: a paragraph's lines joined, so that a span may wrap.
    joined = "\n".join(text for _, text in prose)
    offsets = [n for n, _ in prose]
    for m in re.finditer(r"`([^`]+)`", joined):
        span = " ".join(m.group(1).split())
        first = span.split(" ", 1)[0]
        if " " not in span or not OURS.match(first):
            continue
        yield rel, offsets[joined.count("\n", 0, m.start())], span


def split_command(text):
    """The simple commands of one line, each as a token list: split at &&, ||, ;, & and a | between spaces (a | inside
    a word is a usage line's alternatives: `train|eval`), with redirections dropped."""
    text = re.sub(r"\d*>>?&?\s*\S+|<\s*\S+", " ", text)  # 2>&1, > a.log, < in
    text = text.replace(" | ", " ; ").replace(" || ", " ; ")
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = text.split()
    parts, cur = [], []
    for t in tokens:
        if t and set(t) <= set(";&"):
            if cur:
                parts.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        parts.append(cur)
    return parts


class Checker:
    def __init__(self, root, build):
        self.root, self.build = root, build
        self.problems, self.checked, self.ran = [], 0, 0

    @functools.lru_cache(maxsize=None)
    def help_text(self, *argv):
        """The --help output of a program (None when it does not exit 0)."""
        try:
            r = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, cwd=self.root)
        except OSError:
            return None
        return r.stdout + r.stderr if r.returncode == 0 else None

    @functools.lru_cache(maxsize=None)
    def subcommands(self):
        text = self.help_text(str(self.build / "bin" / "tessera")) or ""
        block = text.split("Commands:", 1)[-1].split("\n\n", 1)[0]
        return {line.split()[0] for line in block.splitlines() if line.strip()}

    def options(self, text):
        return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text or ""))

    def problem(self, where, cmd, message):
        self.problems.append(f"{where[0]}:{where[1]}: `{cmd}`: {message}")

    def check(self, where, text):
        for argv in split_command(text):
            while argv and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]) or argv[0] in ("time", "sudo", "env")):
                m = re.match(r"^[A-Za-z_][A-Za-z0-9_]*=\$\((.+)", argv[0])
                argv = ([m.group(1)] if m else []) + argv[1:]  # X=$(prog ...): prog; X=1 prog: prog
            if not argv:
                continue
            self.checked += 1
            prog = argv[0]
            if prog in ("tessera", "build/bin/tessera"):
                self.check_tessera(where, text, argv[1:])
            elif prog.startswith("build/bin/"):
                self.check_binary(where, text, prog, argv[1:])
            elif prog.startswith("tessera-gpu-kit/src/"):  # the GPU kit's copy of a checkout file (docs/gpu.md)
                self.check_script(where, text, prog[len("tessera-gpu-kit/src/"):], argv[1:])
            elif "/" in prog and prog.split("/", 1)[0] in TOP:
                self.check_script(where, text, prog, argv[1:])
            elif prog in EXTERNAL or prog.startswith(("~/", "/", "$", "./")) or PLACEHOLDER.search(prog):
                self.check_paths(where, text, argv[1:])
            else:
                self.problem(where, text, f"{prog} is neither one of our programs nor in EXTERNAL (tools/check_docs.py)")

    def check_paths(self, where, text, args):
        for a in args:
            a = a.split("=", 1)[-1]
            if "/" not in a or PLACEHOLDER.search(a) or "[" in a or a.startswith(("http", "s3:", "gs:", "oci:")):
                continue
            if a.split("/", 1)[0] in TOP and not (self.root / a).exists():
                self.problem(where, text, f"{a} does not exist in the checkout")

    def optional_args(self, args):
        """Arguments with usage brackets removed: `[--quick]` -> `--quick`."""
        return [a.strip("[]") for a in args if a.strip("[]") not in ("", "|")]

    def check_tessera(self, where, text, args):
        tessera = str(self.build / "bin" / "tessera")
        args = self.optional_args(args)
        if not args or args[0].startswith("-"):
            sub = []
        else:
            names = args[0].split("|")
            if PLACEHOLDER.search(args[0]):
                return  # `tessera <command>`
            for name in names:
                if name not in self.subcommands():
                    self.problem(where, text, f"tessera has no command {name}")
                    return
            sub = names[:1] if len(names) == 1 else []
            args = args[1:]
        if sub == ["help"]:
            if args and PLACEHOLDER.search(args[0]):
                return  # `tessera help <command>`
            sub, args = args[:1], ["--help"]  # `tessera help train` is `tessera train --help`
        help_text = self.help_text(tessera, *sub)
        if help_text is None:
            self.problem(where, text, f"`tessera {' '.join(sub)} --help` fails")
            return
        known = self.options(help_text)
        for a in args:
            if a.startswith("-") and not PLACEHOLDER.search(a.split("=", 1)[0]):
                opt = a.split("=", 1)[0]
                if opt not in known:
                    self.problem(where, text, f"tessera {' '.join(sub)} has no option {opt}".replace("  ", " "))
        self.check_paths(where, text, args)
        self.maybe_run(where, text, sub, args)

    def maybe_run(self, where, text, sub, args):
        line = " ".join(["tessera", *sub, *args])
        if any(PLACEHOLDER.search(a) for a in args):
            return
        argv = [str(self.build / "bin" / "tessera"), *sub, *args]
        if any(re.search(p, line) for p, _ in NOT_PLANNED):
            return
        if sub == ["train"] and "--recipe" in args[:-1] and (self.root / args[args.index("--recipe") + 1]).is_file():
            argv += [a for a in ("--dry-run", "--no-preflight") if a not in args]  # every training command, planned
        elif not any(re.fullmatch(p, line) for p in RUN):
            return
        self.ran += 1
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=self.root)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
            self.problem(where, text, f"exits {r.returncode}: {tail[0][:200]}")

    def check_binary(self, where, text, prog, args):
        path = self.build / prog[len("build/"):]
        if not path.exists():
            self.problem(where, text, f"{prog} is not built (no {path})")
            return
        known = self.options(self.help_text(str(path)))
        for a in self.optional_args(args):
            opt = a.split("=", 1)[0]
            if opt.startswith("--") and known and opt not in known and not PLACEHOLDER.search(opt):
                self.problem(where, text, f"{prog} has no option {opt}")
        self.check_paths(where, text, args)

    def check_script(self, where, text, prog, args):
        path = self.root / prog
        if not path.is_file():
            self.problem(where, text, f"{prog} does not exist in the checkout")
            return
        if not os.access(path, os.X_OK) and path.suffix in ("", ".sh"):
            self.problem(where, text, f"{prog} is not executable")
        body = path.read_text(encoding="utf-8", errors="replace")
        for a in self.optional_args(args):
            opt = a.split("=", 1)[0]
            if opt.startswith("--") and not PLACEHOLDER.search(opt) and opt not in body:
                self.problem(where, text, f"{prog} has no option {opt}")
        self.check_paths(where, text, args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1])
    ap.add_argument("--build", type=pathlib.Path, help="the build tree (default ROOT/build)")
    a = ap.parse_args()
    root = a.root.resolve()
    build = (a.build or root / "build").resolve()
    if not (build / "bin" / "tessera").exists():
        print(f"check_docs: {build}/bin/tessera does not exist (build the test preset first)", file=sys.stderr)
        return 2
    c = Checker(root, build)
    for path in doc_files(root):
        for rel, line, text in commands_in(path, root):
            c.check((rel, line), text)
    for p in c.problems:
        print(p)
    if c.problems:
        print(f"check_docs: {len(c.problems)} problem{'s' if len(c.problems) > 1 else ''} in {c.checked} commands",
              file=sys.stderr)
        return 1
    print(f"check_docs: {c.checked} commands in README.md and docs/ match the code; {c.ran} of them run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
