"""tools/check_docs.py fails, naming the file, line and what is wrong, on commands in the docs that the code does not
accept: a mistyped option, a recipe that is not there, a program that is not ours, an override the recipe rejects,
a script option the script lacks; and passes the same commands written correctly. (The `docs` ctest entry runs it on
the checkout.)"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_docs.py"
BUILD = pathlib.Path(os.environ.get("TESSERA_BUILD_DIR", ROOT / "build"))


def check(tmp_path, readme):
    """check_docs.py on a checkout of README.md alone, with the real recipes/ and tools/ beside it."""
    for part in ("recipes", "tools"):
        (tmp_path / part).symlink_to(ROOT / part)
    (tmp_path / "README.md").write_text(readme)
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path), "--build", str(BUILD)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def built():
    if not (BUILD / "bin" / "tessera").exists():
        pytest.fail(f"{BUILD}/bin/tessera is not built (TESSERA_BUILD_DIR names the build tree)")


GOOD = """# Example

```sh
build/bin/tessera train --recipe recipes/mpt-tiny-cpu.yaml max_duration=5ba --dry-run
tools/prepare_corpus.sh && build/bin/tessera train --recipe recipes/llama-tiny-cpu.yaml optimizer.lr=1e-3
```

Then `tessera tokenizer --input data --vocab-size 300 --output t.json` and `tessera help train`; `cmake --build build`.
"""


def test_commands_the_code_accepts_pass(tmp_path):
    r = check(tmp_path, GOOD)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 commands in README.md and docs/ match the code; 3 of them run" in r.stdout


BAD = [
    ("build/bin/tessera train --recipee recipes/mpt-tiny-cpu.yaml", "tessera train has no option --recipee"),
    ("build/bin/tessera train --recipe recipes/mpt-tiny.yaml", "recipes/mpt-tiny.yaml does not exist in the checkout"),
    ("train --recipe recipes/mpt-tiny-cpu.yaml", "train is neither one of our programs nor in EXTERNAL"),
    ("build/bin/tessera train --recipe recipes/mpt-tiny-cpu.yaml optimizer.lrr=1e-3",
     "exits 2: error: [recipe] command line `optimizer.lrr=1e-3`: optimizer.lrr: unknown key"),
    ("tools/prepare_corpus.sh --fast", "tools/prepare_corpus.sh has no option --fast"),
    ("build/bin/tessera evaluate --model m", "tessera has no command evaluate"),
]


def test_a_command_the_code_rejects_is_named_with_its_file_and_line(tmp_path):
    block = "\n".join(bad for bad, _ in BAD)
    r = check(tmp_path, GOOD.replace("build/bin/tessera train --recipe recipes/mpt-tiny-cpu.yaml max_duration=5ba "
                                     "--dry-run", block).replace("--vocab-size 300", "--vocab 300"))
    assert r.returncode == 1, r.stdout + r.stderr
    for line, (bad, message) in enumerate(BAD, 4):
        assert f"README.md:{line}: `{bad}`: {message}" in r.stdout, r.stdout
    # Inline spans are commands too.
    assert ("README.md:13: `tessera tokenizer --input data --vocab 300 --output t.json`: tessera tokenizer has no "
            "option --vocab") in r.stdout, r.stdout
    assert "check_docs: 7 problems in 10 commands" in r.stderr
