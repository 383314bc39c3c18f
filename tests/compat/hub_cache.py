"""A Hugging Face hub cache (HF_HUB_CACHE layout: models--org--name/refs/main -> snapshots/REV/) holding the published
config.json of each model in tests/data/hub_configs/ (org--name.json), and a folder main-job-export/ holding
main-job-export.json; shared by the compat and composer suites (tests/unit/test_util.h builds the same for C++)."""
import pathlib

HUB_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "data" / "hub_configs"
REVISION = "0" * 40


def make_hub_cache(root):
    for file in sorted(HUB_CONFIGS.glob("*.json")):
        if file.stem == "main-job-export":
            (root / file.stem).mkdir()
            (root / file.stem / "config.json").write_text(file.read_text())
            continue
        folder = root / ("models--" + file.stem)
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text(REVISION)
        (folder / "snapshots" / REVISION).mkdir(parents=True)
        (folder / "snapshots" / REVISION / "config.json").write_text(file.read_text())
    return root


def snapshot(root, name):
    """The folder a hub id resolves to in the cache."""
    return root / ("models--" + name.replace("/", "--")) / "snapshots" / REVISION
