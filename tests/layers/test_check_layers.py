"""tools/check_layers.py passes on the checkout and fails, naming the file, line and layers, on planted violations."""
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "check_layers.py"


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def copy_layers(tmp_path):
    for part in ("include", "src"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def test_checkout_follows_the_layer_order():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "follow the layer order" in r.stdout


def test_upward_include_fails_naming_file_line_and_layers(tmp_path):
    root = copy_layers(tmp_path)
    f = root / "src" / "util" / "device.cpp"
    lines = f.read_text().splitlines()
    lines.insert(2, '#include "tessera/trainer/trainer.h"')
    f.write_text("\n".join(lines) + "\n")
    r = run(root)
    assert r.returncode == 1
    assert "src/util/device.cpp:3: util includes tessera/trainer/trainer.h (trainer is above util)" in r.stdout


def test_plugin_layers_may_not_include_the_trainer_or_each_other(tmp_path):
    root = copy_layers(tmp_path)
    h = root / "include" / "tessera" / "callbacks" / "callbacks.h"
    h.write_text(h.read_text() + '#include "tessera/trainer/train_config.h"\n#include "tessera/loggers/loggers.h"\n')
    r = run(root)
    assert r.returncode == 1
    assert "callbacks includes tessera/trainer/train_config.h (trainer is above callbacks)" in r.stdout
    assert "callbacks includes tessera/loggers/loggers.h (loggers and callbacks are independent layers" in r.stdout


def test_unknown_layer_folder_fails(tmp_path):
    root = copy_layers(tmp_path)
    (root / "src" / "misc").mkdir()
    (root / "src" / "misc" / "x.cpp").write_text('#include "tessera/util/error.h"\n')
    r = run(root)
    assert r.returncode == 1
    assert "src/misc/x.cpp: folder 'misc' is not a layer" in r.stdout
