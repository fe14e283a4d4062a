"""How long a Python-backend stub takes to import its module, in fresh interpreters.

A stub process imports `oceanus.backends.python.pb_stub` (and nothing of the server: no
tritonclient, no core beyond datatypes) before it can import model.py. This times that import
in new interpreters, alternating between checkouts so that the machine's noise hits them alike:

    python bench/investigations/python_worker_import.py [--runs 15] [OTHER_CHECKOUT ...]

Each checkout (this one first) is put first on PYTHONPATH. Prints the median and the best of
`-X importtime`'s cumulative figure for the module and the whole interpreter's wall time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
import benchlib

MODULE = "oceanus.backends.python.pb_stub"
SERVER_SIDE = ("tritonclient", "grpc", "google.protobuf", "oceanus.core.server")


def one_run(checkout: Path) -> tuple[float, float, list[str]]:
    """(import of the module in ms, interpreter wall time in ms, server-side modules loaded)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    code = f"import sys, {MODULE}; print(' '.join(sys.modules))"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = (time.perf_counter() - started) * 1000
    cumulative = 0.0
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == MODULE:
            cumulative = int(parts[1]) / 1000
    loaded = done.stdout.split()
    heavy = sorted({m for m in loaded if m.startswith(SERVER_SIDE)})
    return cumulative, wall, heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    checkouts = [benchlib.ROOT, *args.checkouts]
    imports: dict[Path, list[float]] = {c: [] for c in checkouts}
    walls: dict[Path, list[float]] = {c: [] for c in checkouts}
    heavy: dict[Path, list[str]] = {}
    for _ in range(args.runs):
        for checkout in checkouts:
            cumulative, wall, loaded = one_run(checkout)
            imports[checkout].append(cumulative)
            walls[checkout].append(wall)
            heavy[checkout] = loaded
    rows = [
        [
            str(c),
            f"{benchlib.median(imports[c]):.1f}",
            f"{min(imports[c]):.1f}",
            f"{benchlib.median(walls[c]):.1f}",
            ", ".join(heavy[c]) or "none",
        ]
        for c in checkouts
    ]
    headers = ["checkout", "import ms (median)", "best", "interpreter ms", "server-side modules"]
    print(benchlib.table(headers, rows))
    print(f"{args.runs} runs each, alternating; load {benchlib.loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
