"""Installs as a reader makes them, each in a fresh virtualenv:

- the Colab path: an environment holding only what Colab preinstalls (torch, numpy, matplotlib) runs Chapter 1
  top to bottom; its setup cell installs transformer-textbook (from this clone instead of GitHub, through the
  TRANSFORMER_LIB_SOURCE override) and everything after it works;
- a plain `pip install` of the built wheel (no extras): `python -m transformer_lib.train` works.

torch is our own, linked into each virtualenv (no multi-GB download, no copy: tools/torch_overlay.py), but the other
packages come from the package registry: these tests need it (marker `registry`; `make test-fast` leaves them out).
Each takes under a minute."""

import json
import os
import subprocess
import sys
import textwrap
import tomllib
import venv
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import torch_overlay  # noqa: E402

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
pytestmark = pytest.mark.registry


def chapter_as_script(path: Path) -> str:
    """The chapter's code cells, in order, as one script (a cell tagged raises-exception must raise)."""
    nb = nbformat.read(path, as_version=4)
    parts = ["import matplotlib\nmatplotlib.use('Agg')\n"]
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        src = cell.source
        assert not any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()), "no IPython magics"
        if "raises-exception" in cell.metadata.get("tags", []):
            src = f"try:\n{textwrap.indent(src, '    ')}\nexcept Exception:\n    pass\nelse:\n    raise SystemExit('cell {i} should raise')"
        parts.append(f"# --- cell {i}\n{src}\n")
    return "\n".join(parts)


def fresh_python(directory: Path, *packages: str) -> Path:
    """A new virtualenv with our torch (linked by tools/torch_overlay.py: no multi-GB download or copy) and
    `packages`."""
    venv.EnvBuilder(with_pip=True).create(directory)
    python = directory / "bin" / "python"
    torch_overlay.link_into(python, directory.parent / "torch-overlay")
    torch_version = torch.__version__.split("+")[0]
    subprocess.run([python, "-m", "pip", "install", "-q", f"torch=={torch_version}", *packages], check=True,
                   env=clean_env())
    return python


def clean_env() -> dict:
    """This process's environment without what would point Python or the setup cell elsewhere, and with pip's
    byte-compiling off: what these tests prove is which packages install and that the code then runs, not the
    .pyc files, and compiling transformers, scipy and nltk on one core took about half of the Colab test's
    time. (pip reads PIP_NO_COMPILE inverted: "0" is what turns compiling off, as --no-compile does.)"""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "TRANSFORMER_LIB_SOURCE"}}
    env["PIP_NO_COMPILE"] = "0"
    return env


def installed_names(python: Path) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                         check=True).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


@pytest.fixture(scope="module")
def colab_python(tmp_path_factory):
    return fresh_python(tmp_path_factory.mktemp("colab") / "venv", "numpy", "matplotlib")


def test_chapter_1_runs_in_a_fresh_colab_like_environment(colab_python, tmp_path):
    find = "import importlib.util as u; print(u.find_spec('transformer_lib') is not None)"
    assert subprocess.run([colab_python, "-c", find], capture_output=True, text=True, cwd=tmp_path,
                          check=True).stdout.strip() == "False"
    script = tmp_path / "chapter.py"
    script.write_text(chapter_as_script(ROOT / "chapters" / "01_attention.ipynb"))
    env = clean_env()
    env["TRANSFORMER_LIB_SOURCE"] = ROOT.as_uri()           # file:///path/to/clone instead of GitHub
    result = subprocess.run([colab_python, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "check_attention_backward: dQ, dK and dV equal autograd's on self- and cross-attention" in result.stdout
    # the setup cell installed the book's library, under its own name and at the chapter's release, with the
    # book's extras (and not PyPI's unrelated transformer-lib)
    names = installed_names(colab_python)
    assert names.get("transformer-textbook") == PYPROJECT["version"]
    assert "transformer-lib" not in names
    assert {"num2words", "sacrebleu", "tqdm", "transformers"} <= set(names)
    # once the library is importable the setup cell does nothing: with a source pip could not install from,
    # it still succeeds, because it never calls pip
    setup_only = chapter_as_script(ROOT / "chapters" / "01_attention.ipynb").split("# --- cell 2")[0]
    env["TRANSFORMER_LIB_SOURCE"] = (tmp_path / "no-such-directory").as_uri()
    again = subprocess.run([colab_python, "-c", setup_only], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_the_cli_works_after_a_plain_install_of_the_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    # the wheel, built from this clone with the build tools already in our environment (no download)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels,
                    ROOT], check=True, capture_output=True)
    (wheel,) = wheels.glob("transformer_textbook-*.whl")
    with zipfile.ZipFile(wheel) as archive:      # the experiments' results, which Chapters 8 and 12 print, ship with it
        assert {f"transformer_lib/results/{name}.json" for name in ("ablation", "t5_tasks", "vit_seeds", "qa_ablation",
                                                                           "summarize_seeds", "decoder_classifier")} <= set(archive.namelist())
        committed = {str(p.relative_to(ROOT)) for p in (ROOT / "transformer_lib" / "checkpoints").rglob("*")
                     if p.is_file()}             # ... and so do the trained models and their records
        assert committed and committed <= set(archive.namelist())
    python = fresh_python(tmp_path / "venv", str(wheel))
    names = installed_names(python)
    assert names.get("transformer-textbook") == PYPROJECT["version"]
    assert not {"matplotlib", "transformers", "sacrebleu"} & set(names), "a plain install pulls no extras"
    run = dict(cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
    help_ = subprocess.run([python, "-m", "transformer_lib.train", "--help"], **run)
    assert help_.returncode == 0 and "--task" in help_.stdout, help_.stderr
    # the same weights as a clone: the committed translator loads, its sha256 checked against its record
    load = ("from transformer_lib.training import load_recipe\n"
            "model, ckpt = load_recipe('translator')\n"
            "print(type(model).__name__, ckpt['step'], sum(p.numel() for p in model.parameters()))")
    loaded = subprocess.run([python, "-c", load], **run)
    assert loaded.returncode == 0 and loaded.stdout.split()[:2] == ["Transformer", "2000"], loaded.stderr[-2000:]
    for task in ("translate", "gpt"):
        args = ["--task", task, "--steps", "3", "--batch-size", "8", "--d-model", "16", "--heads", "2",
                "--d-ff", "32", "--layers", "1", "--numbers", "300", "--valid", "20", "--context", "16",
                "--text-chars", "20000", "--no-progress", "--device", "cpu"]
        result = subprocess.run([python, "-m", "transformer_lib.train", *args], **run)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"{task}: step 3/3 on 1 process(es)" in result.stdout, result.stdout
