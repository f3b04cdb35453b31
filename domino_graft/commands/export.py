"""`domino-graft export [RUN] [-o BUNDLE] [--engine sglang|vllm|hf | --format native|hf] [--dtype bf16|fp16|fp32]
[--dry-run]`."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("run", nargs="?", metavar="RUN", help="run directory (default: the most recent one)")
    p.add_argument("-o", "--out", metavar="BUNDLE", help="bundle folder (default: bundles/<run>-<format>-<dtype>)")
    p.add_argument("--engine", choices=("sglang", "vllm", "hf"), help="the engine that will serve the bundle: picks "
                   "its format (sglang: native, hf: hf, vllm: the base drafter without the Domino head, which vLLM "
                   "cannot run) and refuses, writing nothing, a bundle that breaks one of that engine's loader rules "
                   "(one line per rule); then prints the serving command. Every export records all engines' "
                   "checklists in manifest.json")
    p.add_argument("--format", choices=("native", "hf"), help="the layout alone, with no engine required to pass: "
                   "native: the family's serving-engine layout (or drafter/ + head.safetensors where no engine reads "
                   "the head); hf: transformers remote code, for families that have it (`domino-graft families`); "
                   "default: --engine's format, else the recipe's export.format")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="weights dtype (default: the recipe's export.dtype)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where to run the self-check (default: the recipe's)")
    p.add_argument("--dry-run", action="store_true", help="print the bundle's tensors and config from configs alone")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at BUNDLE (anything else there "
                   "is never replaced)")


def run(args) -> int:
    if args.dry_run:
        from ..artifacts.rundir import resolve_run, run_recipe
        from ..export.plan import plan_bundle

        print(plan_bundle(run_recipe(resolve_run(args.run)), format=args.format, dtype=args.dtype,
                          engine=args.engine).format_text())
        return 0
    from ..progress import loading

    loading("export")
    from ..export.run import export_run

    export_run(args.run, args.out, format=args.format, dtype=args.dtype, device=args.device, force=args.force,
               engine=args.engine)
    return 0
