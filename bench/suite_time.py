"""How long the test suite takes: the quick tier (the inner loop) and CI (`.ci/run`: a fresh virtual environment,
then the whole suite), timed as whole commands with the machine's load beside each run.

    python bench/suite_time.py --quick-runs 5            # `pytest -m quick`, 5 runs in a row
    python bench/suite_time.py --quick-runs 5 --ci       # the same, then one `.ci/run`

Writes bench/results/suite_time.json; the README's contributor section quotes it (bench/results_page.py). The
figures are only honest on an idle machine: each run records the 1-minute load average at its start and end,
and the report says the largest, so a reader can tell a busy machine's figure from an idle one's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "suite_time.json"
QUICK = [sys.executable, "-m", "pytest", "-m", "quick", "-q", "-rfE", "-p", "no:cacheprovider"]
CI = ["bash", ".ci/run"]


def timed(command: list[str], log: Path | None = None) -> dict:
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    wall = time.perf_counter() - start
    if log is not None:  # the whole output (pytest's 20 slowest tests of each run are in it): where the time went
        log.write_text(run.stdout + run.stderr)
    summary = next((line for line in reversed(run.stdout.splitlines())
                    if " in " in line and any(word in line for word in ("passed", "failed", "error"))), "")
    failed = [line.split()[1] for line in run.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"wall_s": round(wall, 1), "exit_code": run.returncode, "pytest_summary": summary.strip("= "), "failed": failed,
            "load_1min_at_start": round(load_before, 2), "load_1min_at_end": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick-runs", type=int, default=5, help="runs of `pytest -m quick` (0: none)")
    parser.add_argument("--ci", action="store_true", help="also time one `.ci/run` (about 25 minutes)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--ci-log", type=Path, help="write `.ci/run`'s whole output here")
    args = parser.parse_args(argv)
    if args.quick_runs < 0:
        parser.error("--quick-runs must be >= 0")
    report: dict = {"command": " ".join(["python bench/suite_time.py", *(argv if argv is not None else sys.argv[1:])]),
                    "cores": os.cpu_count()}
    if args.quick_runs:
        runs = []
        for index in range(args.quick_runs):
            runs.append(timed(QUICK))
            print(f"quick tier run {index + 1}: {runs[-1]['wall_s']} s ({runs[-1]['pytest_summary']})", flush=True)
        report["quick"] = {"command": "python -m pytest -m quick", "runs": runs,
                           "max_wall_s": max(r["wall_s"] for r in runs),
                           "all_passed": all(r["exit_code"] == 0 for r in runs),
                           "max_load_1min": max(max(r["load_1min_at_start"], r["load_1min_at_end"]) for r in runs)}
    if args.ci:
        run = timed(CI, args.ci_log)
        print(f".ci/run: {run['wall_s']} s ({run['pytest_summary']})", flush=True)
        report["ci"] = {"command": "bash .ci/run", **run,
                        "max_load_1min": max(run["load_1min_at_start"], run["load_1min_at_end"])}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    failed = [r for r in report.get("quick", {}).get("runs", [])] + ([report["ci"]] if "ci" in report else [])
    return 1 if any(r["exit_code"] != 0 for r in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
