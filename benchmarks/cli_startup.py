"""How long the `pagedchat` command takes to answer before any model is touched:
`pagedchat --help`, a command's `--help` and a usage error, each against `python -c pass`
(the interpreter's own start), in alternating rounds on a warm file cache.

    python benchmarks/cli_startup.py              # 10 rounds
    python benchmarks/cli_startup.py --rounds 30

Prints, for each case, the median wall time, its difference from `python -c pass` and
their ratio. The target is a median under 0.3 s for every case.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "pagedchat --help": [sys.executable, "-m", "pagedchat.cli", "--help"],
    "pagedchat run --help": [sys.executable, "-m", "pagedchat.cli", "run", "--help"],
    "pagedchat bench --help": [sys.executable, "-m", "pagedchat.cli", "bench", "--help"],
    "pagedchat bench throughput --help": [sys.executable, "-m", "pagedchat.cli", "bench",
                                          "throughput", "--help"],
    "pagedchat run --no-such-option": [sys.executable, "-m", "pagedchat.cli", "run",
                                       "--no-such-option"],
}
TARGET_S = 0.3


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    for command in CASES.values():  # warm the file cache and the bytecode
        timed(command)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, command in CASES.items():
            times[name].append(timed(command))
    base = statistics.median(times["python -c pass"])
    print(f"{'case':36} {'median_s':>9} {'minus_python_s':>15} {'ratio':>7} {'target':>7}")
    for name, spent in times.items():
        median = statistics.median(spent)
        met = "" if name == "python -c pass" else ("met" if median < TARGET_S else "missed")
        print(f"{name:36} {median:9.3f} {median - base:15.3f} {median / base:7.1f} {met:>7}")


if __name__ == "__main__":
    main()
