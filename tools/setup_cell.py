"""The first code cell of every chapter, generated from ``_config.yml`` and ``pyproject.toml``.

On Colab a chapter opens alone, without the repository, so its first cell must install the book's library.
It recognises the library by its distribution name (``transformer-textbook``) and version, never by the
module name ``transformer_lib`` alone (the Package Index holds an unrelated ``transformer-lib`` whose module
has the same name), and installs the release the chapter was written with: the git tag ``v<version>`` of the
repository in ``_config.yml`` (the same URL the Colab button uses). A local clone's editable install
(``make venv``) has that version already, so there the cell does nothing. After changing the URL or the
version run ``python tools/setup_cell.py --write``; the test suite fails when a chapter's setup cell differs
from what this script generates.

The environment variable ``TRANSFORMER_LIB_SOURCE`` overrides the source (a ``file:///path/to/clone`` or
any pip URL); ``tests/test_colab.py`` uses it to run a chapter in a fresh virtualenv without GitHub.
"""

import sys
import tomllib
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIRST_LINE = "# Setup: on Colab, install this book's library; on a local clone, do nothing."

TEMPLATE = '''{first_line}
import importlib.metadata as md, os, subprocess, sys

LIBRARY, RELEASE = "{name}", "{version}"  # the release this chapter was written with
REPOSITORY = "git+{url}.git"
others = [d for d in md.packages_distributions().get("transformer_lib", []) if d != LIBRARY]
if others:  # a module of the same name from another project
    raise RuntimeError(f"transformer_lib here comes from {{others}}, not this book: pip uninstall {{others[0]}}")
try:
    installed = md.version(LIBRARY)
except md.PackageNotFoundError:  # Colab, or any environment without the book's library
    installed = None
if installed != RELEASE:  # install the release that matches this chapter (tag v<RELEASE>)
    source = os.environ.get("TRANSFORMER_LIB_SOURCE", f"{{REPOSITORY}}@v{{RELEASE}}")
    requirement = f"{{LIBRARY}}[book] @ {{source}}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--upgrade", requirement], check=True)'''


def repository_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["repository"]["url"].rstrip("/")


def distribution() -> tuple[str, str]:
    """(name, version) of the package, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["name"], project["version"]


def setup_cell_source() -> str:
    name, version = distribution()
    return TEMPLATE.format(first_line=FIRST_LINE, url=repository_url(), name=name, version=version)


def find_setup_cells(nb) -> list[int]:
    """Indices of the code cells that start with `# Setup:` (a new chapter may hold a placeholder)."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith("# Setup:")]


def main(argv: list[str]) -> int:
    write = "--write" in argv
    expected, stale = setup_cell_source(), []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = find_setup_cells(nb)
        if len(cells) != 1:
            stale.append(f"{path.name}: expected one setup cell, found {len(cells)}")
        elif nb.cells[cells[0]].source != expected:
            if write:
                nb.cells[cells[0]].source = expected
                nbformat.write(nb, path)
            else:
                stale.append(f"{path.name}: setup cell differs from tools/setup_cell.py")
    print("\n".join(stale) or "setup cells are current")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
