"""Every number a chapter's prose states is backed by what the chapter shows and CI compares (issues 20 and 47):
an output nbval compares, a committed JSON the chapter loads, or a cited fact in ALLOWED with its bib key. The
tests of the test doctor copies of a real chapter and show that the check fails where it should."""

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
def test_prose_numbers_are_backed(path):
    bad = prose_numbers.check(path)
    assert not bad, (f"{path.stem}: {len(bad)} prose number(s) not backed by a compared output, a loaded JSON or "
                     f"ALLOWED: {[str(b) for b in bad]}. Print the number in a compared cell and quote it, quote a "
                     "number the chapter prints, reword, or (a number from the literature) add it to "
                     "tools/prose_numbers.py's ALLOWED with its citation key")


def test_allowed_numbers_cite_a_source_in_the_bibliography():
    bib = (ROOT / "references.bib").read_text(encoding="utf-8")
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    for chapter, numbers in prose_numbers.ALLOWED.items():
        assert (ROOT / "chapters" / f"{chapter}.ipynb").exists(), chapter
        for number, key in numbers.items():
            assert key in keys, f"{chapter}: {number!r} cites {key!r}, not in references.bib"


# The tests of the test work on Chapter 4 (small, no loaded JSON) and Chapter 12 (loads result JSONs).
def _cells(stem):
    return json.loads((ROOT / "chapters" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]


def _with_prose(cells, text):
    """cells with a markdown cell `text` (id "planted") appended."""
    out = copy.deepcopy(cells)
    out.append({"cell_type": "markdown", "id": "planted", "metadata": {}, "source": text})
    return out


def _code(source, output, ignored=False):
    return {"cell_type": "code", "id": "code-planted", "metadata": {}, "execution_count": 1,
            "source": ("# NBVAL_IGNORE_OUTPUT\n" if ignored else "") + source,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": output}]}


def _failures(cells, stem):
    return prose_numbers.failures(cells, prose_numbers.ALLOWED.get(stem))[0]


@pytest.fixture(scope="module")
def chapter4():
    cells = _cells("04_feed_forward")
    base = _failures(cells, "04_feed_forward")
    return cells, {(b.cell, b.number) for b in base}


def _new(cells, stem, before):
    return [b for b in _failures(cells, stem) if (b.cell, b.number) not in before]


def test_a_planted_wrong_number_fails(chapter4):
    cells, before = chapter4
    new = _new(_with_prose(cells, "The model reaches 87.31 % after 4,321 steps."), "04_feed_forward", before)
    assert {(b.cell, b.number, b.kind) for b in new} == {("planted", "87.31 %", "none"), ("planted", "4,321", "none")}
    assert str(sorted(new, key=str)[0]) == "none: '4,321' [cell planted]"          # what the failure message names


def test_a_number_printed_by_a_compared_output_passes(chapter4):
    cells, before = chapter4
    doctored = _with_prose(cells, "The model reaches 87.3 % after 4,321 steps.")
    doctored.append(_code("print(acc, steps)", "accuracy 0.8731 after 4321 steps\n"))
    assert _new(doctored, "04_feed_forward", before) == []


def test_a_number_only_in_a_code_literal_fails(chapter4):
    cells, before = chapter4
    doctored = _with_prose(cells, "We train for 4,321 steps.")
    doctored.append(_code("STEPS = 4321\nprint('done')", "done\n"))
    assert [(b.number, b.kind) for b in _new(doctored, "04_feed_forward", before)] == [("4,321", "code-only")]


def test_a_number_only_in_an_ignored_output_fails(chapter4):
    cells, before = chapter4
    doctored = _with_prose(cells, "Training took 4,321 steps and reached 87.3 %.")
    doctored.append(_code("print(steps, acc)", "4321 steps, accuracy 87.3%\n", ignored=True))
    assert {(b.number, b.kind) for b in _new(doctored, "04_feed_forward", before)} == {
        ("4,321", "ignored-only"), ("87.3 %", "ignored-only")}


def test_a_sanitized_duration_is_not_compared(chapter4):
    cells, before = chapter4
    doctored = _with_prose(cells, "One step takes 12.5 ms.")
    doctored.append(_code("print(t)", "one step: 12.5 ms\n"))
    assert [(b.number, b.kind) for b in _new(doctored, "04_feed_forward", before)] == [("12.5", "ignored-only")]


def test_four_times_against_a_table_of_9_to_12_fails(chapter4):
    """The expert review's example: "beam search costs about four times as much as greedy" where the chapter's own
    table shows 9-12x. The same sentence with the table's numbers passes."""
    cells, before = chapter4
    table = _code("print(table)", "beam / greedy time\nk=2   9.1x\nk=4  10.6x\nk=8  12.2x\n")
    wrong = _with_prose(cells, "Beam search costs about four times as much as greedy decoding.")
    wrong.append(table)
    assert [b.number for b in _new(wrong, "04_feed_forward", before)] == ["four times"]   # the 4 of "4 heads" is no ratio
    right = _with_prose(cells, "Beam search costs 9-12 times as much as greedy decoding.")
    right.append(table)
    assert _new(right, "04_feed_forward", before) == []
    half_right = _with_prose(cells, "Beam search costs 9-15× as much as greedy decoding.")
    half_right.append(table)
    assert [b.number for b in _new(half_right, "04_feed_forward", before)] == ["9-15×"]


def test_a_number_in_a_loaded_json_passes():
    """Chapter 12 loads transformer_lib/results/vit_seeds.json: a number only that file holds passes, and fails
    once the chapter no longer loads the file."""
    cells = _cells("12_t5_and_vit")
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    loaded = prose_numbers.loaded_jsons(code)
    seeds = ROOT / "transformer_lib" / "results" / "vit_seeds.json"
    assert seeds in loaded
    others = [p for p in loaded if p != seeds]
    elsewhere, *_ = prose_numbers.pools(cells, jsons=others)
    pool = set()
    prose_numbers._json_values(json.loads(seeds.read_text(encoding="utf-8")), pool)
    only_here = sorted(v for v in pool if 0 < v < 1 and not any(abs(v - w) <= 5e-5 for w in elsewhere))
    assert only_here, "vit_seeds.json holds no number the rest of the chapter lacks"
    planted = f"{only_here[0]:.4f}"
    doctored = _with_prose(cells, f"One seed's accuracy was {planted}.")
    before = {(b.cell, b.number) for b in _failures(cells, "12_t5_and_vit")}
    assert [b for b in _failures(doctored, "12_t5_and_vit") if (b.cell, b.number) not in before] == []
    new = prose_numbers.failures(doctored, prose_numbers.ALLOWED.get("12_t5_and_vit"), jsons=others)[0]
    assert [(b.cell, b.number) for b in new if b.cell == "planted"] == [("planted", planted)]


@pytest.mark.parametrize("text, numbers", [
    ("See Chapter 8, §10.3, section 4.2, Figure 2, Exercise 3, Table 1 and equation (3).", []),
    ("In 2017 the paper (Python 3.11, torch 2.13, GPT-2, float32, SHA-256) used 8 heads.", []),
    ("Math is skipped, $d_\\text{model} = 512$, but not a measured $\\approx 0.69$; nor `code 123`.", ["0.69"]),
    ("It took 9-12 times, twice as long, four times the memory, 3× and 2.5 x; 45.3 % of 1,234.",
     ["9-12 times", "3×", "2.5 x", "45.3 %", "1,234", "four times", "twice"]),
    ("About nine times in ten it is right, with 4 layers and 3 heads.", []),
])
def test_what_counts_as_a_prose_number(text, numbers):
    assert sorted(n.text for n in prose_numbers.prose_numbers(text)) == sorted(numbers)
