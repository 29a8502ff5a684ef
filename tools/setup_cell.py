"""The first code cell of every chapter, generated from the repository URL in ``_config.yml``.

On Colab a chapter opens alone, without the repository, so its first cell must install ``transformer_lib``.
The URL it installs from is the one in ``_config.yml`` (the same one the Colab button uses), so it is kept
in one place: change it there and run ``python tools/setup_cell.py --write``. The test suite fails when a
chapter's setup cell differs from what this script generates.

The environment variable ``TRANSFORMER_LIB_SOURCE`` overrides the source (a ``file:///path/to/clone`` or
any pip URL); ``tests/test_colab.py`` uses it to run a chapter in a fresh virtualenv without the network.
"""

import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIRST_LINE = "# Setup: on Colab, install this book's library; on a local clone, do nothing."

TEMPLATE = '''{first_line}
import importlib.util, os, subprocess, sys

if importlib.util.find_spec("transformer_lib") is None:  # not installed: Colab or similar
    repository = "git+{url}.git"
    source = os.environ.get("TRANSFORMER_LIB_SOURCE", repository)
    requirement = f"transformer_lib[book] @ {{source}}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], check=True)'''


def repository_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["repository"]["url"].rstrip("/")


def setup_cell_source() -> str:
    return TEMPLATE.format(first_line=FIRST_LINE, url=repository_url())


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
