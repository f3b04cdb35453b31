"""Do the committed results still rebuild from the committed records? (CPU, about a minute)

    python experiments/check_results.py

Each pipeline report in bench/results (a JSON whose `command` ran the report stage) is rebuilt by
experiments/smollm2_pipeline.py from the run folder beside it (the `eval/*.jsonl.gz` records and
training summaries) and compared with the committed file, the `command` key aside (it names the
script where it lived then); then the results table is rebuilt (`combine_smollm2.py --check`).
Tests never read bench/results (they read tests/fixtures/); this is the check that does.
Exit 1 if anything differs.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = REPO / "bench" / "results"


def report_commands() -> dict[Path, list[str]]:
    """committed report -> the pipeline arguments that made it (its own `command`, minus the script)."""
    out = {}
    for path in sorted(RESULTS.glob("*.json")):
        command = json.loads(path.read_text()).get("command", "")
        if isinstance(command, str) and "smollm2_pipeline.py" in command and "--stages report" in command:
            out[path] = shlex.split(command)[1:]
    return out


def _with_out(args: list[str], out: Path) -> list[str]:
    i = args.index("--out")
    return args[:i + 1] + [str(out)] + args[i + 2:]


def main() -> int:
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for path, args in report_commands().items():
            out = Path(tmp) / path.name
            r = subprocess.run([sys.executable, str(HERE / "smollm2_pipeline.py"), *_with_out(args, out)],
                               cwd=REPO, capture_output=True, text=True)
            same = r.returncode == 0 and _strip(json.loads(out.read_text())) == _strip(json.loads(path.read_text()))
            print(f"{path.relative_to(REPO)}: {'rebuilds' if same else 'DIFFERS from a rebuild'}")
            if not same:
                failed.append(path.name)
                print(r.stderr[-2000:], file=sys.stderr)
    if subprocess.run([sys.executable, str(HERE / "combine_smollm2.py"), "--check"], cwd=REPO).returncode:
        failed.append("smollm2_h200.json")
    return 1 if failed else 0


def _strip(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "command"}


if __name__ == "__main__":
    sys.exit(main())
