"""The servers the serving tests share: module-scoped, stopped (SIGTERM, exit 0 checked) at the end."""

from __future__ import annotations

import pytest

from .harness import Reference, Server, apply_tiny


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """tiny_dflash grafted onto a tiny HF target with a word-level tokenizer and a ChatML template:
    text prompts on /v1/completions, the chat template on /v1/chat/completions."""
    from domino_graft.recipe import load_recipe
    from domino_graft.target import load_target
    from tests.training.test_train_data import tiny_tokenizer

    from .harness import REPO

    root = tmp_path_factory.mktemp("serve-chat")
    hf = root / "target"
    target = load_target(load_recipe(str(REPO / "recipes" / "tiny_dflash.yaml")).target)
    target.model.config.eos_token_id = 1
    target.model.save_pretrained(hf)
    tiny_tokenizer().save_pretrained(hf)
    run = apply_tiny("dflash", root / "run", ["target.random=null", f"target.path={hf}"])
    server = Server(run, "--max-batch", "4", "--served-model-name", "tiny-chat", "--max-body-bytes", "20000",
                    log=root / "serve.log")
    try:
        yield server, Reference(run)
    finally:
        rc = server.stop()
        assert rc == 0, f"serve exited with {rc}:\n{server.log()}"
