"""The sync check (`tools/export.py --check`) catches a chapter edited without re-exporting."""

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def book_copy(tmp_path):
    for name in ("chapters", "transformer_lib", "tools"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / "_config.yml", tmp_path)
    return tmp_path


def check(root):
    return subprocess.run([sys.executable, "tools/export.py", "--check"], cwd=root, capture_output=True, text=True)


def edit_first_export_cell(path, edit):
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("#| export"))
    cell.source = edit(cell.source)
    nbformat.write(nb, path)


def test_in_sync_library_passes(book_copy):
    result = check(book_copy)
    assert result.returncode == 0, result.stderr
    assert "in sync" in result.stdout


def test_editing_an_export_cell_without_exporting_fails(book_copy):
    edit_first_export_cell(book_copy / "chapters" / "01_attention.ipynb", lambda s: s + "\nANSWER = 42\n")
    result = check(book_copy)
    assert result.returncode == 1
    assert "transformer_lib/attention.py changed" in result.stderr
    assert "ANSWER = 42" in (book_copy / "transformer_lib" / "attention.py").read_text()   # and it re-exported
    assert check(book_copy).returncode == 0                                                # idempotent


def test_a_module_missing_from_the_library_fails(book_copy):
    (book_copy / "transformer_lib" / "attention.py").unlink()
    result = check(book_copy)
    assert result.returncode == 1 and "attention.py was missing" in result.stderr


def test_a_new_untracked_module_fails_in_a_git_checkout(book_copy):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=book_copy, check=True)
    subprocess.run([*git, "add", "-A"], cwd=book_copy, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=book_copy, check=True)
    nb_path = book_copy / "chapters" / "01_attention.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("#| export extra\ndef extra():\n    return 1"))
    nbformat.write(nb, nb_path)
    first = check(book_copy)
    assert first.returncode == 1 and "extra.py was missing" in first.stderr
    second = check(book_copy)          # exported now, but git does not know it: a clone would lack it
    assert second.returncode == 1 and "transformer_lib/extra.py is not tracked by git" in second.stderr
