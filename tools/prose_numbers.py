"""Prose numbers must come from compared outputs (issues 20 and 47).

Every number a chapter's markdown states must equal, at the precision the prose prints it, a number that the same
chapter shows the reader and CI checks:

- an output of a code cell that nbval compares: not marked `# NBVAL_IGNORE_OUTPUT` or `# NBVAL_SKIP`, and read
  after the rewrites of tests/nbval_sanitize.cfg (a duration such as "12.3 s" is sanitized away, so it counts as
  not compared); or
- a committed JSON the chapter loads: `load_results("x")` -> transformer_lib/results/x.json, `load_recipe("x")`,
  `recipe_record("x")`, `recipe_checkpoint("x", ...)` -> transformer_lib/checkpoints/x.json (its numbers and
  numeric keys); or
- a committed JSON that the markdown cell itself names by its path in inline code (`benchmarks/results/x.json`:
  a measurement recorded while writing, quoted in that cell); or
- the chapter's entry in ALLOWED: a number cited from the literature, with its citation key in references.bib.

A number in a code literal or only in an ignored output does not count.

Which numbers are read: integers >= 10, every decimal, every percentage, ratios ("4×", "9-12 times", "2.5x",
"3-fold", also small integers), and number words that state a ratio ("four times", "twice", "half as"). A
decimal matches within half a unit of its last digit; an integer exactly, or within its rounding (at most 5 %)
after "about", "roughly", "~" and the like; a percentage also matches a printed fraction (95.3 % ~ 0.953); a
range matches when both ends do; "65M", "7B", "12k" are scaled. Not read: math ($...$), except a math span that
is only a value ("$\\approx 0.69$", "$3\\times$"); inline code; link targets and citations; headings' section
numbers; years (1900-2030 without a comma) and dates; version numbers (Python 3.11, torch 2.13); references
("Chapter 8", "§10.3", "section 4.2", "Figure 2", "Exercise 3", "Table 1", "equation (3)", "issue 47"); digits
inside names (GPT-2, float32, AVX-512).

Usage: python tools/prose_numbers.py [-v] [chapters/NN_x.ipynb ...]   # one line per chapter; exit 1 on failure
"""

import configparser
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"

# chapter stem: {number as the prose writes it (digits, with "%", "×" or its word when it has one): citation key
# of its source in references.bib}. Only numbers quoted from the literature belong here.
ALLOWED: dict[str, dict[str, str]] = {
    "02_multi_head_attention": {"0.9": "vaswani2017attention",      # Table 3, rows (A): BLEU below the best
                                "0.4": "vaswani2017attention"},     # (1 head; 32 heads)
    "07_decoder": {"1024": "vaswani2017attention", "2048": "vaswani2017attention",   # Table 3: the two models
                   "4096": "vaswani2017attention", "0.3": "vaswani2017attention"},
    "08_training": {"37,000": "vaswani2017attention",            # the paper's shared BPE vocabulary (section 5.1)
                    "65 million": "vaswani2017attention"},       # Table 3, the base model
    "09_complexity": {"65 M": "vaswani2017attention", "213 M": "vaswani2017attention"},   # Table 3
    "10_encoder_only": {"110 million": "devlin2019bert",       # BERT-base's parameters
                        "3.3 billion": "devlin2019bert"},      # BooksCorpus 800M + English Wikipedia 2,500M words
    "13_scaling": {"25,000": "vaswani2017attention",                # section 5.1: tokens per batch, each side
                   "100,000": "vaswani2017attention",               # section 5.2: the base model's steps
                   "300,000": "vaswani2017attention",               # the big model's steps
                   "0.1": "vaswani2017attention"},                  # section 5.4: P_drop of the base model
    "15_applications": {"257": "goodger2001pep257"},             # PEP 257, the docstring conventions
}

WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
         "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
         "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
         "hundred": 100, "thousand": 1000}
_WORD = "|".join(WORDS)
# a number word that states a ratio: "four times as", "ten-fold", "twice the", "half as", "half the time" (not a count:
# "repeated six times", "nine times in ten")
_COMPARED = (r"as|the|its|their|that|this|what|more|less|fewer|faster|slower|larger|smaller|longer|shorter|bigger|"
             r"higher|lower|cheaper|many|much|over")
RATIO_WORD = re.compile(rf"\b(?:({_WORD})(?:\s+|-)(?:times(?=\s+(?:{_COMPARED})\b)|fold\b)|"
                        rf"(twice)(?=\s+(?:{_COMPARED})\b)|(half)\s+(?:as\b|the\s+(?:time|memory|cost|"
                        rf"size|speed|parameters|steps|compute|work|loss|error|length)))", re.I)
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+|\d{1,3}(?:[ \u2009\u202f]\d{3})+(?![\d.,])|\d+)(\.\d+)?(?:e([-+]?\d+)\b)?")
AFTER = re.compile(r"\s?(%|×(?!\s*[\d$(])|x\b(?!\s*[\d$(])|(?:[- ])?times\b|-fold\b|[kKMB]\b|[\s-]*million\b|[\s-]*billion\b)")
RANGE = re.compile(r"^\s*(?:-|–|to)\s*(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
APPROX = re.compile(r"(about|around|roughly|approximately|nearly|almost|some|~|≈|over|under|more than|less than|"
                    r"above|below|at least|at most|up to)\s*$", re.I)
NEAR_APPROX = re.compile(r"\b(about|around|roughly|approximately|nearly)\s+[\d,.]+\s*(?:and|or|to|,)\s*$", re.I)
REFERENCE = re.compile(r"(?:(?<!\w)(?:chapters?|sections?|figures?|fig\.|exercises?|tables?|equations?|eq\.|appendix|"
                       r"issues?|items?|cells?|lines?|version|python|torch|pytorch|transformers|tokenizers|numpy|"
                       r"jupyter\s+book|cuda|v)|§)\s*(?:≥|>=|<=|≤|==)?\s*\(?$", re.I)
# a list after a reference: "Chapters 8 and 10", "§10.3, 10.4", "Exercises 2-3"
REFERENCE_LIST = re.compile(r"(?:(?<!\w)(?:chapters?|sections?|figures?|exercises?|tables?|equations?)|§)\s*\(?[\d.]+\)?"
                            r"(?:\s*(?:,|and|or|-|–|to)\s*\(?[\d.]+\)?)*\s*(?:,|and|or|-|–|to)\s*\(?$", re.I)


@dataclass
class Number:
    text: str        # as the prose writes it
    values: tuple    # each must be printed (a range has two)
    decimals: int    # the prose's precision, digits after the point (negative: rounded to tens, hundreds)
    percent: bool
    approx: bool
    ratio: bool = False


def _float(whole: str, frac: str | None, exp: str | None = None) -> float:
    return float(re.sub(r"[, \u2009\u202f]", "", whole) + (frac or "") + (f"e{exp}" if exp else ""))


def plain(md: str) -> str:
    """The prose a reader reads as text: math (but a math span that is only a value), code, link targets,
    citations, headings' section numbers and dates removed."""
    md = re.sub(r"(?m)^(#+\s*)[\d.]+", r"\1", md)                          # "## 8.3 Label smoothing"
    md = re.sub(r"\$\$.*?\$\$", " ", md, flags=re.S)
    md = re.sub(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", " ", md, flags=re.S)

    def math(m):
        t = m.group(1).strip()
        v = re.fullmatch(r"(?:\\approx|\\sim|~|<|>|\\le[q]?|\\ge[q]?)?\s*(-?\d[\d.,]*)\s*(\\%|\\times)?", t)
        if v:
            return " ≈ " + v.group(1) + {"\\%": "%", "\\times": "×", None: ""}[v.group(2)] + " "
        return " "
    md = re.sub(r"(?<![\\$])\$([^$\n]+)\$", math, md)
    md = re.sub(r"```.*?```", " ", md, flags=re.S)
    md = re.sub(r"\{[a-z:]+\}`[^`]*`", " ", md)                             # {cite}`x`, {ref}`y`
    md = re.sub(r"`[^`]*`", " ", md)
    md = re.sub(r"\]\([^)]*\)", "]", md)                                   # link targets
    md = re.sub(r"<[^>]+>", " ", md)                                       # html tags
    md = re.sub(r"https?://\S+", " ", md)
    md = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", md)                          # dates
    md = re.sub(r"(\d)\.\.(\d)", r"\1 to \2", md)                              # ranges: 0..999
    md = re.sub(r"(?i)\b(sha-?256|sha|md5|commit)\s+[0-9a-f]{7,}\b", " ", md)
    return md


def prose_numbers(md: str) -> list[Number]:
    text = plain(md)
    out = []
    skip_to = 0
    for m in NUMBER.finditer(text):
        if m.start() < skip_to:
            continue
        whole, frac, exp = m.group(1), m.group(2), m.group(3)
        before = text[max(0, m.start() - 40):m.start()]
        if REFERENCE.search(before) or REFERENCE_LIST.search(before):
            continue
        end = m.end()
        values = [_float(whole, frac, exp)]
        decs = [len(frac) - 1 if frac else 0]
        r = RANGE.match(text[end:])
        if r and not exp:
            values.append(_float(r.group(1), r.group(2)))
            decs.append(len(r.group(2)) - 1 if r.group(2) else 0)
            end += r.end()
        a = AFTER.match(text[end:])
        unit = a.group(1).strip(" -") if a else ""
        percent, ratio = unit == "%", unit in ("×", "x", "times", "-fold", "fold")
        scale = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "million": 1e6, "billion": 1e9}.get(unit, 1)
        if exp:
            decs = [decs[0] - int(exp)]
        if not (frac or exp or percent or ratio or scale != 1) and all(v < 10 for v in values):
            continue                                                       # a small integer that is not a ratio
        if (not frac and not exp and not unit and len(values) == 1 and whole.isdigit()
                and 1900 <= values[0] <= 2030):
            continue                                                       # a year
        if scale != 1:
            values = [v * scale for v in values]
            decs = [d - round(__import__("math").log10(scale)) for d in decs]
        s = text[m.start():end + (a.end() if a else 0)].replace("\n", " ").strip()
        skip_to = end
        out.append(Number(s, tuple(values), min(decs), percent, bool(APPROX.search(before) or NEAR_APPROX.search(before)),
                          ratio))
    for m in RATIO_WORD.finditer(text):
        word = (m.group(1) or m.group(2) or m.group(3)).lower()
        value = {"twice": 2.0, "half": 0.5}.get(word) or float(WORDS[word])
        out.append(Number(m.group(0).replace("\n", " "), (value,), 0 if value >= 1 else 1, False,
                          bool(APPROX.search(text[max(0, m.start() - 40):m.start()])), True))
    return out


def _sanitizers() -> list[tuple[re.Pattern, str]]:
    cfg = configparser.ConfigParser()
    cfg.read(SANITIZE, encoding="utf-8")
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


def printed_values(text: str) -> set[float]:
    """The numbers an output prints ("65M" and "3.4 million" also scaled)."""
    out = set()
    text = text.replace("..", " .. ")                                    # ranges: 0..9,999
    for m in re.finditer(r"(?<![\w.])-?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-+]?\d+))?(\s?(?:[kMB]\b|million\b|billion\b))?",
                         text):
        v = _float(m.group(1), m.group(2), m.group(3))
        out.add(abs(v))
        if m.group(4):
            out.add(abs(v) * {"k": 1e3, "M": 1e6, "B": 1e9, "million": 1e6, "billion": 1e9}[m.group(4).strip()])
    return out


def ratio_values(text: str) -> set[float]:
    """The printed numbers that can back a ratio ("4×", "four times"): written with a decimal point or followed
    by ×, x or "times" (a bare integer such as "4 heads" does not)."""
    out = set()
    for m in re.finditer(r"(?<![\w.])(\d+)(\.\d+)?(?:e([-+]?\d+))?(\s?(?:×|x\b|times\b))?", text):
        if m.group(2) or m.group(3) or m.group(4):
            out.add(_float(m.group(1), m.group(2), m.group(3)))
    return out


def _json_values(obj, out: set[float], ratios: set[float] | None = None) -> None:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        out.add(abs(float(obj)))
        if ratios is not None and isinstance(obj, float):
            ratios.add(abs(obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if re.fullmatch(r"-?\d+(\.\d+)?", str(k)):
                out.add(abs(float(k)))
            _json_values(v, out, ratios)
    elif isinstance(obj, list):
        for v in obj:
            _json_values(v, out, ratios)
    elif isinstance(obj, str) and not re.fullmatch(r"[0-9a-f]{7,}", obj):   # numbers in text, not in hashes
        out |= printed_values(obj)


def loaded_jsons(code: str) -> list[Path]:
    """The committed JSON files a chapter's code loads."""
    out = []
    for m in re.finditer(r"load_results\(\s*[\"'](\w+)[\"']", code):
        out.append(ROOT / "transformer_lib" / "results" / f"{m.group(1)}.json")
    for m in re.finditer(r"(?:load_recipe|recipe_record|recipe_checkpoint)\(\s*[\"'](\w+)[\"']", code):
        out.append(ROOT / "transformer_lib" / "checkpoints" / f"{m.group(1)}.json")
    return sorted(set(out))


def _ignored(source: str) -> bool:
    return bool(re.search(r"^# ?NBVAL_(IGNORE_OUTPUT|SKIP)", source, re.M))


def _output_text(cell: dict) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append("".join(o.get("text", "")))
        for key, value in o.get("data", {}).items():
            if key.startswith("text/"):
                parts.append("".join(value))
        if o.get("output_type") == "error":
            parts.append(f"{o.get('ename', '')}: {o.get('evalue', '')}")
    return "\n".join(parts)


def matches(n: Number, pool: set[float], ratios: set[float] | None = None) -> bool:
    """Every value of the prose number n equals one in pool (a ratio: one in ratios), at the prose's precision."""
    if n.ratio and ratios is not None:
        pool = ratios
    def one(v: float) -> bool:
        tol = 0.5 * 10 ** (-n.decimals) * (1 + 1e-9) + 1e-12
        if n.approx and n.decimals <= 0 and v >= 10:                       # "about 25,000": its rounding, <= 5 %
            zeros = len(str(int(v))) - len(str(int(v)).rstrip("0"))
            tol = max(tol, min(0.5 * 10 ** zeros, 0.05 * v))
        return any(abs(v - p) <= tol or (n.percent and abs(v - 100 * p) <= tol) for p in pool)
    return all(one(v) for v in n.values)


@dataclass
class Failure:
    cell: str
    number: str
    kind: str        # none / code-only / ignored-only

    def __str__(self):
        return f"{self.kind}: {self.number!r} [cell {self.cell}]"


def pools(cells: list[dict], jsons: list[Path] | None = None) -> tuple[set, set, set, set]:
    """(compared: what nbval compares + the loaded JSONs, ignored: outputs nbval does not compare, code literals,
    ratios: the compared numbers that can back a ratio)"""
    sanitizers = _sanitizers()
    compared, ignored, code, ratios = set(), set(), set(), set()
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for path in (loaded_jsons(source) if jsons is None else jsons):
        _json_values(json.loads(path.read_text(encoding="utf-8")), compared, ratios)
    for c in cells:
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        code |= printed_values(src)
        out = _output_text(c)
        if _ignored(src):
            ignored |= printed_values(out)
        else:
            for regex, replace in sanitizers:
                ignored |= {v for m in regex.finditer(out) for v in printed_values(m.group(0))}
                out = regex.sub(replace, out)
            compared |= printed_values(out)
            ratios |= ratio_values(out)
    return compared, ignored, code, ratios


def failures(cells: list[dict], allowed: dict[str, str] | None = None, jsons: list[Path] | None = None,
             ) -> tuple[list[Failure], int]:
    """The prose numbers of a chapter (its cells, as in the .ipynb JSON) that nothing compared backs, and how
    many prose numbers were read."""
    compared, ignored, code, ratios = pools(cells, jsons)
    bad, count = [], 0
    for c in cells:
        if c["cell_type"] != "markdown":
            continue
        md = "".join(c["source"])
        cited, cited_ratios = set(), set()            # a committed JSON this cell names: `benchmarks/results/x.json`
        for name in re.findall(r"`([\w/.-]+\.json)`", md):
            for path in (ROOT / name, ROOT / "benchmarks" / "results" / name, ROOT / "transformer_lib" / "results" / name):
                if path.is_file():
                    _json_values(json.loads(path.read_text(encoding="utf-8")), cited, cited_ratios)
                    break
        for n in prose_numbers(md):
            count += 1
            if n.text in (allowed or {}) or matches(n, compared, ratios) or matches(n, cited, cited_ratios):
                continue
            kind = "ignored-only" if matches(n, ignored) else "code-only" if matches(n, code) else "none"
            bad.append(Failure(c.get("id", "?"), n.text, kind))
    return bad, count


def check(path: Path) -> list[Failure]:
    return failures(json.loads(path.read_text(encoding="utf-8"))["cells"], ALLOWED.get(path.stem))[0]


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    paths = [Path(p) for p in argv if p != "-v"] or sorted((ROOT / "chapters").glob("*.ipynb"))
    total = 0
    for path in paths:
        bad, count = failures(json.loads(path.read_text(encoding="utf-8"))["cells"], ALLOWED.get(path.stem))
        total += len(bad)
        kinds = {k: sum(b.kind == k for b in bad) for k in ("none", "code-only", "ignored-only")}
        print(f"{path.stem}: {count} prose numbers, {len(bad)} not backed by a compared output, a loaded JSON or "
              f"ALLOWED" + (f" ({', '.join(f'{k} {v}' for k, v in kinds.items() if v)})" if bad else ""))
        if verbose or len(paths) == 1:
            for b in bad:
                print(f"    {b}")
    print(f"{total} prose numbers not backed")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
