"""What every script of experiments/ does with its runs: print each as it ends, and write them all as one JSON."""

import json

import torch


def log(runs: list, run: dict) -> None:
    """Append one run's result and print it as a JSON line (long scripts show their progress)."""
    runs.append(run)
    print(json.dumps(run), flush=True)


def write_results(script: str, settings: dict, runs: list, path: str | None) -> dict:
    """The results file: the script, its settings (its argparse defaults, unless overridden), the torch version
    and thread count, and every run; written to path if given."""
    result = {"script": script, **settings, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "runs": runs}
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    return result
