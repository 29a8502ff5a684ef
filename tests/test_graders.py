"""The grader table: every grader on its correct answers (float64 and float32 work), which pass and print the
grader's line, and on its named mistakes, which raise AssertionError naming the mistake in the reader's terms.
The rows are the GRADERS lists of tests/test_exercises*.py, next to the answers they use."""

import importlib
from pathlib import Path

import pytest
from helpers import Call

CASES = []
for path in sorted(Path(__file__).parent.glob("test_exercises*.py")):
    for check, correct, mistakes, prints in getattr(importlib.import_module(path.stem), "GRADERS", []):
        chapter = path.stem.removeprefix("test_exercises").strip("_") or "float32"
        name = f"{chapter}-{check.__name__}"
        for i, answer in enumerate(correct):
            CASES.append(pytest.param(check, answer, None, prints, id=f"{name}-passes-{i}"))
        for i, (answer, words) in enumerate(mistakes):
            CASES.append(pytest.param(check, answer, words, None, id=f"{name}-mistake-{i}-{words[:40]}"))


def run(check, answer):
    return answer.run(check) if isinstance(answer, Call) else check(answer)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("check, answer, words, prints", CASES)
def test_grader(check, answer, words, prints, capsys):
    if check.__name__ == "check_rouge_l":        # grades against rouge-score (the book's requirements install it)
        pytest.importorskip("rouge_score")
    if words is None:
        run(check, answer)
        out = capsys.readouterr().out
        for words in [f"{check.__name__}:"] + ([prints] if isinstance(prints, str) else prints):
            assert words in out, out
    else:
        with pytest.raises(AssertionError, match=words):
            run(check, answer)
