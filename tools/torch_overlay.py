"""Give a fresh virtualenv the torch of this interpreter without installing it again.

torch's CPU wheel unpacks to about 900 MB, which takes about 40 s per virtualenv on two cores. The fresh
virtualenvs of the tests (tests/test_colab.py) and of `make test-floor` need exactly the torch of `.venv`
(`TORCH_SPEC`), so they read it from a directory of symbolic links to our torch and to the distributions it
requires (filelock, sympy, ...), through a `.pth` file in their site-packages. pip then finds torch installed and
installs only the rest; a distribution the new environment pins at another version is installed into its own
site-packages, which comes first on its path.

    python tools/torch_overlay.py NEW_VENV_PYTHON OVERLAY_DIR
"""

import argparse
import importlib.metadata
import subprocess
from pathlib import Path

from packaging.requirements import Requirement


def build_overlay(directory: Path) -> Path:
    """Symbolic links in `directory` to this interpreter's torch and every distribution it requires."""
    directory.mkdir(parents=True, exist_ok=True)
    todo, seen = ["torch"], set()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        site = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            link = directory / top
            if not link.exists():
                link.symlink_to(site / top)
    return directory


def link_into(python: Path, directory: Path) -> None:
    """Make the virtualenv of `python` see the overlay (a .pth file in its site-packages)."""
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "torch_overlay.pth").write_text(f"{build_overlay(directory)}\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("python", type=Path, help="the new virtualenv's python")
    parser.add_argument("overlay", type=Path, help="the directory of links (created if missing)")
    args = parser.parse_args()
    link_into(args.python, args.overlay.resolve())
