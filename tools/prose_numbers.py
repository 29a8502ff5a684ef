"""Prose numbers must come from outputs (issue 20): every number with a unit or a measured meaning in a chapter's
markdown (%, ×, x, s, ms, seconds, minutes, bits, MB, GiB, ...) must appear, at the precision the prose prints it,
in an output or a code cell of the same chapter, or be listed in ALLOWED with its source (a citation key of
references.bib, for a number the book quotes from the literature).

Numbers inside $math$ and link targets are not read. A printed fraction also matches a percentage (0.953 ~ 95.3 %).

Usage: python tools/prose_numbers.py [chapters/NN_x.ipynb ...]   # one line per chapter; exit 1 if any is unsourced
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUM = re.compile(r"(?<![\w.\-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*"
                 r"(%|×|x\b|s\b|ms\b|seconds|minutes|bits|GiB|MiB|GB|MB|kB)")
VALUE = re.compile(r"(?<![\w])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e-?\d+)?)")

# chapter stem: {number as the prose writes it (with its unit): citation key of its source in references.bib}
ALLOWED: dict[str, dict[str, str]] = {}


def _values(text: str) -> set[float]:
    out = set()
    for m in VALUE.finditer(text):
        try:
            out.add(float(m.group(1).replace(",", "")))
        except ValueError:
            pass
    return out


def _matches(value: float, decimals: int, printed: set[float]) -> bool:
    tol = 0.5 * 10 ** (-decimals) + 1e-12
    return any(abs(value - p) <= tol or abs(value - 100 * p) <= tol for p in printed)


def unsourced(cells: list[dict], allowed: dict[str, str] | None = None) -> list[str]:
    """The prose numbers of a chapter (its cells, as in the .ipynb JSON) that no output or code cell prints."""
    printed = set()
    for c in cells:
        for o in c.get("outputs", []):
            printed |= _values("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")))
        if c["cell_type"] == "code":
            printed |= _values("".join(c["source"]))
    bad = []
    for c in cells:
        if c["cell_type"] != "markdown":
            continue
        prose = re.sub(r"\$[^$]*\$|\[[^\]]*\]\([^)]*\)", " ", "".join(c["source"]))
        for m in NUM.finditer(prose):
            text = m.group(0).replace("\n", " ")
            digits = m.group(1).replace(",", "")
            if text in (allowed or {}):
                continue
            if not _matches(float(digits), len(digits.split(".")[1]) if "." in digits else 0, printed):
                bad.append(text)
    return bad


def check(path: Path) -> list[str]:
    return unsourced(json.loads(path.read_text(encoding="utf-8"))["cells"], ALLOWED.get(path.stem))


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "chapters").glob("*.ipynb"))
    total = 0
    for path in paths:
        bad = check(path)
        total += len(bad)
        print(f"{path.stem}: {len(bad)} prose number(s) in no output" + (f": {bad}" if bad else ""))
    print(f"{total} prose numbers in no output")
    sys.exit(1 if total else 0)
