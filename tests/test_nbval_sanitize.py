"""The substitutions nbval applies before comparing stored and fresh outputs (tests/nbval_sanitize.cfg)."""

import re
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

CFG = Path(__file__).with_name("nbval_sanitize.cfg")


def sanitize(text: str) -> str:
    """What nbval does to a stored and a fresh output: the file read by nbval's own parser, applied in order."""
    patterns = get_sanitize_patterns(CFG.read_text())
    assert len(patterns) == CFG.read_text().count("\nregex: "), "nbval did not read every pattern in the file"
    for regex, replace in patterns:
        text = re.sub(regex, replace, text)
    return text


@pytest.mark.parametrize("stored, fresh", [
    ("max |ours - PyTorch| = 2.4e-15", "max |ours - PyTorch| = 3.1e-15"),   # round-off on another CPU
    ("diff 8.9e-16, 4.4e-16", "diff 1.1e-16, 2e-17"),
    ("max change of any logit 0.0e+00", "max change of any logit 1.8e-15"),
    ("trained in 112.3 s", "trained in 98.0 s"),
    ("<Foo at 0x7f3a2c>", "<Foo at 0x55d1e0>"),
])
def test_volatile_text_compares_equal(stored, fresh):
    assert sanitize(stored) == sanitize(fresh)


@pytest.mark.parametrize("stored, fresh", [
    ("max |ours - PyTorch| = 2.4e-15", "max |ours - PyTorch| = 3.1e-04"),   # a real disagreement
    ("max change 0.0e+00", "max change 1.0e-01"),
    ("|J| 2.1e-07", "|J| 3.5e-07"),
    ("lr 7.0e-04", "lr 7.0e-05"),
    ("accuracy 100.0 %", "accuracy 99.0 %"),
])
def test_real_differences_still_fail(stored, fresh):
    assert sanitize(stored) != sanitize(fresh)
