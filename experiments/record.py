"""What every script of experiments/ does with its runs: print each as it ends, and write them all as one JSON."""

import argparse
import json
import platform

import torch


def seeds_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every script has: --seeds (default 0 1 2) and --json (where to write the results); the
    script adds its budgets. Its description is the first paragraph of doc (the script's docstring)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", default=None, help="write the results here")
    return parser


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


def save_json(result: dict, path: str | None) -> None:
    """Write result to path, if given. The GPU scripts call it after every run, so that what is done so far
    survives a time limit."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def machine(device: str) -> dict:
    """Where a script ran: the device (and the GPU's name), the CPU, torch, Python and the thread count."""
    return {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}
