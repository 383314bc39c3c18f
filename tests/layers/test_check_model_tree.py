"""tools/check_model_tree.py passes on the checkout, which has no finding left, and fails, naming file and line, on a
family fact planted outside its family's folder (elsewhere in Tessera, in the shared blocks, in another family's
folder), a collective planted in model code, and an allowance left above what a file has (so allowances only
shrink)."""
import importlib.util
import json
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
    assert "within its allowances (0 family facts outside their folders, 0 parallel calls in models/)" in r.stdout, \
        r.stdout


def test_a_family_name_or_type_outside_its_folder_fails_naming_file_and_line(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "trainer" / "microbatching.cpp"
    plant(f, 3, 'static const char* kPlanted = "mixtral";')
    plant(f, 4, "struct PlantedUse { tessera::models::LlamaOptions o; };")
    blocks = root / "src" / "models" / "blocks" / "layers.cpp"
    plant(blocks, 3, 'static const char* kPlanted = "gpt_neox";')
    other = root / "src" / "models" / "opt" / "opt.cpp"
    plant(other, 3, 'static const char* kPlanted = "phi3";')
    own = root / "src" / "models" / "phi3" / "phi3.cpp"
    plant(own, 3, 'static const char* kOwn = "phi3";')
    r = run(root)
    assert r.returncode == 1
    assert ('src/trainer/microbatching.cpp:3: family name "mixtral" (family llama) outside its family folder'
            in r.stdout), r.stdout
    assert "src/trainer/microbatching.cpp:4: family type LlamaOptions outside its family folder" in r.stdout, r.stdout
    assert 'src/models/blocks/layers.cpp:3: family name "gpt_neox" (family gpt_neox) outside its family folder' \
        in r.stdout, r.stdout
    assert 'src/models/opt/opt.cpp:3: family name "phi3" (family phi3) outside its family folder' in r.stdout, \
        r.stdout
    assert "src/models/phi3/phi3.cpp" not in r.stdout, r.stdout


def test_a_new_family_folder_owns_the_names_its_family_cpp_registers(tmp_path):
    root = copy_tree(tmp_path)
    folder = root / "src" / "models" / "my_family"
    folder.mkdir()
    (folder / "family.cpp").write_text('void register_family_my_family(R& r) { r.add("my_family"); }\n')
    (folder / "my_family.cpp").write_text('static const char* kType = "my_family";\n')
    data = root / "tests" / "data" / "hf_default_configs" / "transformers-4.57.6.json"
    types = json.loads(data.read_text())
    types["my_family"] = {}
    data.write_text(json.dumps(types))
    r = run(root)
    assert r.returncode == 0, r.stdout + r.stderr
    (root / "src" / "models" / "llama" / "llama.cpp").write_text(
        (root / "src" / "models" / "llama" / "llama.cpp").read_text() + 'static const char* kX = "my_family";\n')
    r = run(root)
    assert r.returncode == 1
    assert 'family name "my_family" (family my_family) outside its family folder' in r.stdout, r.stdout


def test_a_collective_in_model_code_fails(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "models" / "opt" / "opt.cpp"
    plant(f, 3, "void planted(tessera::dist::Communicator& c, at::Tensor t) { c.all_reduce(t); }")
    r = run(root)
    assert r.returncode == 1
    assert "src/models/opt/opt.cpp:3: Communicator in model code" in r.stdout, r.stdout
    assert "src/models/opt/opt.cpp:3: all_reduce in model code" in r.stdout, r.stdout


def test_an_allowance_above_what_a_file_has_must_be_lowered(tmp_path):
    spec = importlib.util.spec_from_file_location("check_model_tree", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    root = copy_tree(tmp_path)
    f = root / "src" / "models" / "opt" / "opt.cpp"
    plant(f, 3, "void planted(at::Tensor t) { group.all_reduce(t); }")
    problems, _ = tool.check(root, allowed={"src/models/opt/opt.cpp": {"parallel": 1}})
    assert problems == []
    problems, _ = tool.check(root, allowed={"src/models/opt/opt.cpp": {"parallel": 2}})
    assert problems == ["src/models/opt/opt.cpp: 1 parallel finding(s), fewer than its allowance of 2: lower ALLOWED "
                        "in tools/check_model_tree.py to match"], problems
