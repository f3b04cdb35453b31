"""`domino-graft export` and `inspect`: a run dir -> a deployable bundle, verified before it is final.

    plan.py          the format, dtype, tensors and files a bundle will have, from configs alone (--dry-run)
    engine_rules.py  a bundle checked against a serving engine's own loader rules (SGLang, vLLM, transformers)
    self_check.py    the written bundle reloaded and its draft logits compared with the model in memory
    model_card.py    the bundle's README.md, from its manifest
    run.py           export_run: the steps above, in order, into an atomic folder
    inspect.py       `domino-graft inspect`: what a bundle or checkpoint folder holds, and which engines load it

The bundle format itself (manifest, headers, checksums) is domino_graft/artifacts/bundle.py;
loading one back into a model, domino_graft/loading.py.
"""
