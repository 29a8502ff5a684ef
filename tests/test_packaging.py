"""Packaging: the distribution name, the chapters' setup cell (which library it accepts, what it installs), the lock
and its check, the floors, REQUIRE_HF. Fast and offline; the installs themselves are in tests/test_colab.py."""

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import lock  # noqa: E402
import setup_cell  # noqa: E402
from helpers import import_hf  # noqa: E402

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_distribution_name_is_our_own():
    # PyPI's `transformer-lib` is someone else's: ours must not normalise to it
    assert PROJECT["name"] == "transformer-textbook"
    assert lock.canonical(PROJECT["name"]) != lock.canonical("transformer_lib")
    assert isinstance(PROJECT["license"], str), "an SPDX string (a table draws setuptools' deprecation warning)"
    assert (ROOT / "LICENSE").is_file()
    # the environment running the tests has this package installed under that name and version
    assert importlib.metadata.version("transformer-textbook") == PROJECT["version"]


def test_the_cli_needs_only_core_dependencies():
    # python -m transformer_lib.train imports tqdm and num2words: both must come with a plain install
    core = {lock.canonical(r.split(">")[0].split("=")[0].split("<")[0]) for r in PROJECT["dependencies"]}
    assert {"torch", "numpy", "tqdm", "num2words"} <= core


# --- the setup cell, executed with importlib.metadata and pip replaced by fakes --------------------------------

class FakePip:
    def __init__(self):
        self.calls = []

    def __call__(self, args, check=False, **kwargs):
        self.calls.append(args)
        return subprocess.CompletedProcess(args, 0)


def run_setup_cell(monkeypatch, installed=None, providers=(), source=None):
    """Execute the generated setup cell with `installed` as the version of transformer-textbook (None: absent) and
    `providers` as the distributions that ship a `transformer_lib` module. Returns the pip calls it made."""
    def version(name):
        if name == "transformer-textbook" and installed is not None:
            return installed
        raise importlib.metadata.PackageNotFoundError(name)

    pip = FakePip()
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.metadata, "packages_distributions",
                        lambda: {"transformer_lib": list(providers)} if providers else {})
    monkeypatch.setattr(subprocess, "run", pip)
    if source is None:
        monkeypatch.delenv("TRANSFORMER_LIB_SOURCE", raising=False)
    else:
        monkeypatch.setenv("TRANSFORMER_LIB_SOURCE", source)
    exec(setup_cell.setup_cell_source(), {})
    return pip.calls


def test_setup_cell_installs_the_chapters_release_when_the_library_is_absent(monkeypatch):
    calls = run_setup_cell(monkeypatch, installed=None)
    assert len(calls) == 1
    url = setup_cell.repository_url()
    requirement = f"transformer-textbook[book] @ git+{url}.git@v{PROJECT['version']}"
    assert calls[0][1:] == ["-m", "pip", "install", "-q", "--upgrade", requirement]


def test_setup_cell_does_nothing_when_the_release_is_installed(monkeypatch):
    assert run_setup_cell(monkeypatch, installed=PROJECT["version"], providers=["transformer-textbook"]) == []


def test_setup_cell_replaces_another_release(monkeypatch):
    calls = run_setup_cell(monkeypatch, installed="0.0.1", providers=["transformer-textbook"])
    assert len(calls) == 1 and calls[0][-1].endswith(f"@v{PROJECT['version']}")


def test_setup_cell_refuses_a_foreign_transformer_lib(monkeypatch):
    # a module named transformer_lib from another distribution (PyPI's transformer-lib) is not the book's library
    with pytest.raises(RuntimeError, match=r"transformer_lib here comes from \['transformer-lib'\].*pip uninstall "
                                           r"transformer-lib"):
        run_setup_cell(monkeypatch, installed=None, providers=["transformer-lib"])


def test_setup_cell_source_override(monkeypatch):
    calls = run_setup_cell(monkeypatch, installed=None, source="file:///some/clone")
    assert calls[0][-1] == "transformer-textbook[book] @ file:///some/clone"


def test_setup_cell_names_the_version_of_pyproject():
    assert f'"transformer-textbook", "{PROJECT["version"]}"' in setup_cell.setup_cell_source()


# --- the lock --------------------------------------------------------------------------------------------------

def test_lock_pins_every_package_exactly_and_leaves_torch_to_the_makefile():
    pins = lock.read_lock()
    assert len(pins) > 100
    assert "torch" not in pins and "transformer-textbook" not in pins
    for name in ("numpy", "matplotlib", "transformers", "tokenizers", "ruff", "playwright", "nbdev", "nbval"):
        assert name in pins, name
    assert "TORCH_SPEC ?= torch==2.13.0" in (ROOT / "Makefile").read_text()


def test_lock_satisfies_the_declared_ranges():
    from packaging.requirements import Requirement

    pins = lock.read_lock()
    declared = [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["book"],
                *PROJECT["optional-dependencies"]["dev"],
                *(line for line in (ROOT / "requirements.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))]
    for text in declared:
        req = Requirement(text)
        if req.name != "torch":
            assert req.specifier.contains(pins[lock.canonical(req.name)], prereleases=True), text


def test_lock_check_names_each_difference():
    have = {"numpy": "2.4.7", "torch": "2.13.0+cpu", "tqdm": "4.70.1"}
    diffs = lock.differences({"numpy": "2.4.6", "tqdm": "4.70.1", "ruff": "0.17.6"}, have, "torch==2.13.0")
    assert diffs == ["numpy 2.4.7 (lock 2.4.6)", "ruff missing (lock 0.17.6)"]
    # a CUDA build of the same torch is the same release; another release is a difference
    assert lock.differences({}, {"torch": "2.13.0+cu130"}, "torch==2.13.0") == []
    assert lock.differences({}, {"torch": "2.14.1"}, "torch==2.13.0") == ["torch 2.14.1 (TORCH_SPEC 2.13.0)"]
    # packages the lock does not mention (nvidia-*) are not differences
    assert lock.differences({"tqdm": "4.70.1"}, {"tqdm": "4.70.1", "nvidia-cublas": "13.1"}, None) == []


def test_lock_check_prints_one_line():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "lock.py"), "check", "--torch", "torch==0.0.1"],
                         capture_output=True, text=True, check=True).stdout
    assert out.count("\n") == 1 and out.startswith("warning:") and "torch" in out and "rebuild" in out


def test_floor_lock_pins_every_declared_floor():
    from packaging.version import Version

    floors = lock.floors()
    assert {"numpy", "transformers", "tokenizers"} <= set(floors)
    pinned = lock.read_lock(lock.FLOOR_LOCK)
    for name, version in floors.items():
        assert name in pinned, f"constraints-floor.txt lacks {name} (run make lock-floor)"
        assert Version(pinned[name]) == Version(version), \
            f"{name}: pyproject's floor is {version}, constraints-floor.txt has {pinned[name]} (run make lock-floor)"


# --- REQUIRE_HF ------------------------------------------------------------------------------------------------

def test_require_hf_turns_a_missing_package_into_a_failure(monkeypatch):
    monkeypatch.setenv("REQUIRE_HF", "1")
    with pytest.raises(pytest.fail.Exception, match="REQUIRE_HF=1 but `import no_such_hf_package` failed"):
        import_hf("no_such_hf_package")
    monkeypatch.delenv("REQUIRE_HF")
    with pytest.raises(pytest.skip.Exception):
        import_hf("no_such_hf_package")
