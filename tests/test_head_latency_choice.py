"""bench/head_latency.py's adoption rules. The persistent pool rollout: a grid-barrier wait is
adopted only up to the largest batch where it agreed token for token, kept its error flag clear
and beat the multi-launch path; between waits, the one adopted for more batches, then the faster.
PDL: kept when it changes no draft and the probed rollouts take less time in all. The selection
overlap: the fastest stream count that drafts the same tokens and wins at every probed batch."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import head_latency as hl  # noqa: E402


def _row(batch: int, persistent_ms: float, multi_ms: float = 0.2, agree: float = 1.0, flag: int = 0) -> dict:
    return dict(batch=batch, error_flag=flag, token_agreement_with_multi_launch=agree, agrees_after_replays=agree == 1.0,
                multi_launch_ms=multi_ms, persistent_ms=persistent_ms)


def test_verdict_stops_at_the_first_batch_that_fails():
    assert hl.persistent_verdict({"batches": [_row(1, 0.1), _row(4, 0.3)]}) == 1  # slower at batch 4
    assert hl.persistent_verdict({"batches": [_row(1, 0.1, agree=0.9), _row(4, 0.1)]}) is None
    assert hl.persistent_verdict({"batches": [_row(1, 0.1, flag=1)]}) is None
    assert hl.persistent_verdict({"error": "timed out", "batches": []}) is None


def test_choice_prefers_more_batches_then_the_faster_wait():
    probes = {"rmw": {"batches": [_row(1, 0.40), _row(4, 0.70)]},  # slower than multi-launch: never adopted
              "volatile": {"batches": [_row(1, 0.15), _row(4, 0.19)]},
              "ld_acquire": {"batches": [_row(1, 0.12), _row(4, 0.25)]}}
    assert hl.persistent_choice(probes) == ("volatile", 4)
    probes["volatile"]["batches"][1] = _row(4, 0.25)
    assert hl.persistent_choice(probes) == ("ld_acquire", 1)
    assert hl.persistent_choice({"rmw": probes["rmw"], "x": {"error": "fault", "batches": []}}) is None


def test_the_resident_w_hh_variant_is_probed_and_can_be_adopted():
    """Every wait is probed, and the default wait with W_hh resident; the choice names a variant
    whose settings head_latency then applies to its KernelConfig."""
    assert set(hl.PERSISTENT_VARIANTS) == {"rmw", "volatile", "ld_acquire", "rmw+whh_resident"}
    assert all(v["pool_persistent_whh_resident"] == (name == "rmw+whh_resident")
               for name, v in hl.PERSISTENT_VARIANTS.items())
    probes = {"rmw": {"batches": [_row(1, 0.40), _row(4, 0.70)]},
              "rmw+whh_resident": {"batches": [_row(1, 0.15), _row(4, 0.30)]}}
    assert hl.persistent_choice(probes) == ("rmw+whh_resident", 1)
    cfg = hl.K.KernelConfig(**hl.PERSISTENT_VARIANTS["rmw+whh_resident"])
    assert cfg.pool_persistent_whh_resident and cfg.pool_persistent_barrier == "rmw"


def _overlap_row(batch: int, ms: dict, agree: dict | None = None) -> dict:
    return dict(batch=batch, ms={str(n): v for n, v in ms.items()},
                agreement_with_batched={str(n): (agree or {}).get(n, 1.0) for n in ms})


def test_select_overlap_adopts_the_fastest_identical_count_that_wins_at_every_batch():
    rows = [_overlap_row(1, {0: 0.177, 1: 0.150, 2: 0.120, 4: 0.125}),
            _overlap_row(4, {0: 0.309, 1: 0.300, 2: 0.290, 4: 0.280})]
    assert hl.select_overlap_choice(rows) == 2
    rows[1]["ms"]["2"] = 0.35  # 2 streams lose at batch 4: the next fastest that wins everywhere
    assert hl.select_overlap_choice(rows) == 4
    rows[1]["agreement_with_batched"]["4"] = 0.98  # other drafts: never adopted, however fast
    assert hl.select_overlap_choice(rows) == 1
    assert hl.select_overlap_choice([_overlap_row(1, {0: 0.1, 1: 0.2, 2: 0.2, 4: 0.2})]) == 0
    assert hl.select_overlap_choice([dict(batch=1, error="fault")]) == 0
    assert hl.select_overlap_choice([]) == 0


def _pdl_row(plain: float, pdl: float, same: bool = True) -> dict:
    return dict(batch=1, rollout="triton", plain_ms=plain, pdl_ms=pdl, same_drafts=same)


def test_pdl_is_kept_when_the_probed_rollouts_take_less_time_in_all():
    # the H200 run at 0fbd1ac: the full-vocabulary batch-1 rollout slower with PDL, the rest faster
    rows = [_pdl_row(0.401, 0.424), _pdl_row(0.199, 0.173), _pdl_row(0.441, 0.416), _pdl_row(0.313, 0.305)]
    assert hl.pdl_verdict(rows) is True
    assert hl.pdl_verdict([_pdl_row(0.2, 0.3), _pdl_row(0.2, 0.15)]) is False  # slower in all
    assert hl.pdl_verdict(rows[:3] + [_pdl_row(0.313, 0.305, same=False)]) is False  # changed a draft
    assert hl.pdl_verdict(rows + [dict(batch=4, rollout="triton_pool", error="fault")]) is False
    assert hl.pdl_verdict([]) is False
