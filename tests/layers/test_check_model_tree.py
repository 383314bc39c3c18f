"""tools/check_model_tree.py passes on the checkout within its recorded allowances, and fails, naming file and line,
on a family fact planted outside models/, a collective planted in model code, and an allowance left above what a
file has (so the allowances only shrink)."""
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_model_tree.py"


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def copy_tree(tmp_path):
    for part in ("include", "src"):
        shutil.copytree(ROOT / part, tmp_path / part)
    (tmp_path / "tests" / "data").mkdir(parents=True)
    shutil.copytree(ROOT / "tests" / "data" / "hf_default_configs", tmp_path / "tests" / "data" / "hf_default_configs")
    return tmp_path


def plant(path, line_no, text):
    lines = path.read_text().splitlines()
    lines.insert(line_no - 1, text)
    path.write_text("\n".join(lines) + "\n")


def test_checkout_is_within_its_allowances():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "within its allowances" in r.stdout


def test_a_family_name_or_type_outside_models_fails_naming_file_and_line(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "trainer" / "microbatching.cpp"
    plant(f, 3, 'static const char* kPlanted = "mixtral";')
    plant(f, 4, "struct PlantedUse { tessera::models::LlamaOptions o; };")
    r = run(root)
    assert r.returncode == 1
    assert 'src/trainer/microbatching.cpp:3: family name "mixtral" outside models/' in r.stdout, r.stdout
    assert "src/trainer/microbatching.cpp:4: family type LlamaOptions outside models/" in r.stdout, r.stdout


def test_a_collective_in_model_code_fails(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "models" / "opt.cpp"
    plant(f, 3, "void planted(tessera::dist::Communicator& c, at::Tensor t) { c.all_reduce(t); }")
    r = run(root)
    assert r.returncode == 1
    assert "src/models/opt.cpp:3: Communicator in model code" in r.stdout, r.stdout
    assert "src/models/opt.cpp:3: all_reduce in model code" in r.stdout, r.stdout


def test_an_allowance_above_what_a_file_has_must_be_lowered(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "checkpoint" / "hf.cpp"
    f.write_text(f.read_text().replace('"gpt_neo"', '"renamed"'))
    r = run(root)
    assert r.returncode == 1
    assert "src/checkpoint/hf.cpp: 4 family finding(s), fewer than its allowance of 5: lower ALLOWED" in r.stdout, \
        r.stdout
