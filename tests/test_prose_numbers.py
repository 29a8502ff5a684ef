"""Every number the prose quotes with a unit is printed by an output of the same chapter (issue 20), and the check
notices when a stored output changes under a quoted number."""

import copy
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import prose_numbers  # noqa: E402

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_prose_numbers_come_from_outputs(path):
    bad = prose_numbers.check(path)
    assert not bad, (f"{path.stem}: the prose quotes {bad}, which no output of the chapter prints: print it and quote "
                     "the output, or add it to tools/prose_numbers.py's ALLOWED with its citation key")


def test_allowed_numbers_cite_a_source_in_the_bibliography():
    bib = (ROOT / "references.bib").read_text(encoding="utf-8")
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    for chapter, numbers in prose_numbers.ALLOWED.items():
        assert (ROOT / "chapters" / f"{chapter}.ipynb").exists(), chapter
        for number, key in numbers.items():
            assert key in keys, f"{chapter}: {number!r} cites {key!r}, not in references.bib"


def test_a_changed_output_under_a_quoted_number_is_caught():
    """Doctor a copy of Chapter 10: its prose quotes the pre-trained model's test accuracy on the 'motif' class,
    45.3 %, from a printed table; change the printed value and the check must name the quoted number."""
    cells = json.loads((ROOT / "chapters" / "10_encoder_only.ipynb").read_text(encoding="utf-8"))["cells"]
    assert prose_numbers.unsourced(cells) == []
    quoted = [m.group(0) for c in cells if c["cell_type"] == "markdown"
              for m in prose_numbers.NUM.finditer("".join(c["source"]))]
    assert "45.3 %" in quoted
    doctored = copy.deepcopy(cells)
    changed = 0
    for c in doctored:
        for o in c.get("outputs", []):
            text = "".join(o.get("text", ""))
            if "45.3" in text:
                o["text"] = text.replace("45.3", "61.0")
                changed += 1
    assert changed
    assert "45.3 %" in prose_numbers.unsourced(doctored)
