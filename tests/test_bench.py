"""`make bench` must keep working: run benchmarks/bench.py on tiny sizes and check the table it writes.

Only the structure is asserted (ratios are timings, which belong in the benchmark's output, not in a test);
the script itself asserts that the prototype equals nn.Transformer in float64, that decoding with and without
the KV cache writes the same tokens, and that the saved-tensor bytes equal complexity.py's formulas."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick_writes_the_table(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick", "--repeats", "1",
                          "--json", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    table = json.loads(out.read_text())
    items = {row["item"].split(".")[0] for row in table["rows"]}
    assert items == {"1", "2", "3", "4"}
    cases = {row["case"] for row in table["rows"] if row["item"].startswith("1.")}
    assert {"ours", "nn.Transformer"} <= cases
    for row in table["rows"]:
        if row["ratio"] is not None:
            assert row["ms"] > 0 and row["ratio"] > 0
    assert "nn.Transformer" in run.stdout and f"written {out}" in run.stdout
