"""decoding/outcomes.py: which arm a static batch runs by what whole decodes at its size measured."""

import pytest

from domino_graft.decoding.outcomes import OUTCOME_MIN, OUTCOME_WINDOW, PROBE_EVERY, PROBE_MAX, Outcomes


def test_an_arm_short_of_samples_runs_until_both_compare():
    seen = Outcomes()
    assert seen.arm_for(4) is None and not seen  # nothing measured: the step model chooses
    for _ in range(OUTCOME_MIN):
        seen.add(4, "plain", 100, 1.0)
    assert seen.arm_for(4) == "spec" and not seen.settled(4)  # plain measured, speculation not: compare
    for rate in range(120, 120 + 10 * (OUTCOME_MIN - 1), 10):
        seen.add(4, "spec", rate, 1.0)
        assert seen.arm_for(4) == "spec"
    seen.add(4, "spec", 130, 1.0)
    assert seen.settled(4) and seen.arm_for(4) == "spec"  # both measured: the faster median
    assert seen.arm_for(8) is None  # sizes are apart


def test_the_faster_median_decides_and_the_step_model_probes():
    seen = Outcomes()
    for rate in (100, 101, 500):  # one odd fast speculative decode does not move the median
        seen.add(2, "spec", rate, 1.0)
    for rate in (110, 112, 109):
        seen.add(2, "plain", rate, 1.0)
    arms = [seen.arm_for(2) for _ in range(2 * PROBE_EVERY)]
    assert [i for i, a in enumerate(arms) if a is None] == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1]
    assert {a for a in arms if a is not None} == {"plain"}
    for _ in range(4):  # plain's median falls to speculation's (101): a tie of medians goes to plain
        seen.add(2, "plain", 101, 1.0)
    assert seen.summary(2)["plain"]["median_tokens_per_s"] == 101.0 and seen.arm_for(2) == "plain"


def test_only_the_last_window_of_an_arm_counts_and_empty_decodes_are_no_sample():
    seen = Outcomes()
    for _ in range(OUTCOME_WINDOW):
        seen.add(16, "spec", 50, 1.0)
    for _ in range(OUTCOME_WINDOW):
        seen.add(16, "spec", 200, 1.0)
    seen.add(16, "spec", 0, 1.0)
    seen.add(16, "plain", 10, 0.0)
    assert seen.summary(16) == {"spec": {"decodes": OUTCOME_WINDOW, "median_tokens_per_s": 200.0},
                                "plain": {"decodes": 0, "median_tokens_per_s": None}, "mixed": 0,
                                "verdict": None, "probe_gap": PROBE_EVERY, "model": None}  # plain not measured
    assert seen.summary(32) is None


def test_an_unknown_arm_is_refused_by_name():
    with pytest.raises(ValueError, match=r"outcome arm: 'lean'; valid: spec, plain, mixed"):
        Outcomes().add(1, "lean", 10, 1.0)


def test_probes_back_off_while_they_confirm_the_verdict_and_come_back_when_one_turns_it():
    seen = Outcomes()
    for _ in range(OUTCOME_MIN):
        seen.add(8, "spec", 90, 1.0)
        seen.add(8, "plain", 100, 1.0)

    def until_probe() -> int:
        """Decided decodes up to and including the next probe (each plain decode adds a plain sample)."""
        for n in range(1, PROBE_MAX + 2):
            arm = seen.arm_for(8)
            if arm is None:
                return n
            seen.add(8, arm, 100, 1.0)
        raise AssertionError("no probe")

    assert until_probe() == PROBE_EVERY
    seen.add(8, "spec", 80, 1.0)  # the probe speculated and lost: plain stays the verdict
    assert until_probe() == 2 * PROBE_EVERY
    seen.add(8, "plain", 100, 1.0)  # a probe that went plain (the model's choice too): the verdict holds
    gaps = []
    for _ in range(6):
        gaps.append(until_probe())
        seen.add(8, "spec", 80, 1.0)
    assert gaps == [4 * PROBE_EVERY, 8 * PROBE_EVERY, PROBE_MAX, PROBE_MAX, PROBE_MAX, PROBE_MAX]
    seen.add(8, "plain", 100, 1.0)
    for _ in range(OUTCOME_WINDOW):  # plain decodes grow slower than speculation's: the verdict turns
        seen.add(8, "plain", 50, 1.0)
    assert seen.arm_for(8) == "spec" and seen.summary(8)["probe_gap"] == PROBE_EVERY  # and probes come back soon
    assert seen.summary(8)["verdict"] == "spec"


def test_a_mixed_decode_is_no_arms_sample_and_sends_the_size_to_each_arm_alone():
    """A decode that speculated and then went plain measures neither arm (at d9b24dd on the H100 greedy B = 8
    went plain on three such warm-up samples where speculating had run 1.10x the target alone): it is
    counted, and from then on each arm runs on its own, the one with fewer decodes first, until both compare."""
    seen = Outcomes()
    seen.add(8, "mixed", 900, 1.0)
    assert seen.summary(8)["spec"]["decodes"] == 0 and seen.summary(8)["mixed"] == 1
    arms = []
    for _ in range(2 * OUTCOME_MIN):
        arm = seen.arm_for(8)
        arms.append(arm)
        seen.add(8, arm, 1100 if arm == "spec" else 1000, 1.0)
    assert arms == ["spec", "plain"] * OUTCOME_MIN and seen.settled(8)
    assert seen.arm_for(8) == "spec"  # the pure arms' medians: 1,100 against 1,000
    assert Outcomes().arm_for(8) is None  # nothing seen: the step model chooses


def test_a_probe_the_step_model_runs_mixed_leaves_the_verdict_and_backs_off():
    seen = Outcomes()
    for _ in range(OUTCOME_MIN):
        seen.add(4, "spec", 90, 1.0)
        seen.add(4, "plain", 100, 1.0)
    for _ in range(PROBE_EVERY - 1):
        assert seen.arm_for(4) == "plain"
        seen.add(4, "plain", 100, 1.0)
    assert seen.arm_for(4) is None  # the probe
    seen.add(4, "mixed", 95, 1.0)
    assert seen.summary(4)["probe_gap"] == 2 * PROBE_EVERY and seen.summary(4)["verdict"] == "plain"
    assert seen.summary(4)["spec"]["decodes"] == OUTCOME_MIN  # nothing joined the speculative side


def test_arms_within_their_spread_run_in_turn_until_apart_or_both_windows_full():
    """At aa4e088 on the H100 greedy B = 8 went plain on three speculative decodes whose tokens/s spread over
    more than the gap of the medians (the prompts' acceptance), and ran plain in 6 timed batches before turning:
    a first verdict now waits until the medians lie apart beyond the spread, or both windows are full."""
    seen = Outcomes()
    # aa4e088's B = 8 timed batches' tokens/s (the plain arm had 6; its last two are filler near them)
    spec_rates = iter([10896, 9868, 9238, 11410, 11825, 12547, 12131, 10214])
    plain_rates = iter([9512, 9939, 9466, 10048, 9762, 9598, 9800, 9700])
    arms = []
    while not seen.settled(8):
        arm = seen.arm_for(8) or "spec"  # the step model's first decode: speculation
        arms.append(arm)
        seen.add(8, arm, next(spec_rates) if arm == "spec" else next(plain_rates), 1.0)
    # three of each (medians 9,868 / 9,512) are within 2 MADs of speculation's spread: on in turn
    assert arms[:2 * OUTCOME_MIN].count("spec") == OUTCOME_MIN and len(arms) > 2 * OUTCOME_MIN
    assert seen.summary(8)["verdict"] == "spec" and seen.arm_for(8) == "spec"

    tied = Outcomes()  # equal arms: no verdict until both windows are full, then plain (a tie)
    for n in range(OUTCOME_WINDOW):
        tied.add(4, "spec", 100, 1.0)
        tied.add(4, "plain", 100, 1.0)
        assert tied.settled(4) == (n == OUTCOME_WINDOW - 1)
        if OUTCOME_MIN - 1 <= n < OUTCOME_WINDOW - 1:
            assert tied.arm_for(4) == "spec"  # both measured, equal counts: speculation first
    assert tied.summary(4)["verdict"] == "plain" and tied.arm_for(4) == "plain"


def test_a_gap_beyond_the_spread_decides_at_outcome_min():
    seen = Outcomes()
    for spec, plain in ((16700, 18500), (16900, 18600), (16400, 18550)):  # greedy B = 16: speculation 0.90x
        seen.add(16, "spec", spec, 1.0)
        seen.add(16, "plain", plain, 1.0)
    assert seen.settled(16) and seen.summary(16)["verdict"] == "plain"


def test_a_first_verdict_against_the_step_models_choice_waits_for_both_windows():
    """cae7362, H100, greedy B = 4: three speculative warm-up decodes (median 4,486 tok/s, tight) against plain's
    5,782 lay apart and sent + Domino plain, where the step model chose speculation and the drafter alone's eight
    speculative decodes ran 6,210. Apart against the model's choice is no verdict until both windows are full;
    apart with it (or where the model has not said) decides at OUTCOME_MIN, as before."""
    early_spec = [4450, 4486, 4510]  # then the speculative decodes after the size's first ones
    later_spec = [6300, 6150, 6400, 6210, 6050]
    plain = [5782, 5700, 5810, 5760, 5790, 5740, 5800, 5770]

    def run(model):
        seen, spec_rates, plain_rates, arms = Outcomes(), iter(early_spec + later_spec), iter(plain), []
        for _ in early_spec:  # the step model's first decodes: speculative
            seen.add(4, "spec", next(spec_rates), 1.0, model=model)
        while not seen.settled(4):
            arm = seen.arm_for(4)
            arms.append(arm)
            seen.add(4, arm, next(spec_rates) if arm == "spec" else next(plain_rates), 1.0, model=model)
        return seen, arms

    agreeing, arms = run("plain")
    assert arms == ["plain"] * OUTCOME_MIN and agreeing.summary(4)["verdict"] == "plain"
    unsaid, arms = run(None)
    assert arms == ["plain"] * OUTCOME_MIN and unsaid.summary(4)["verdict"] == "plain"
    disagreeing, arms = run("spec")
    assert len(arms) == 2 * OUTCOME_WINDOW - OUTCOME_MIN  # both windows full
    assert disagreeing.summary(4)["verdict"] == "spec" and disagreeing.arm_for(4) == "spec"
    assert disagreeing.summary(4)["spec"]["median_tokens_per_s"] == 6150.0  # median_high of the eight


def test_the_model_said_is_one_of_the_arms():
    with pytest.raises(ValueError, match="outcome model: 'lean'"):
        Outcomes().add(1, "plain", 10, 1.0, model="lean")


@pytest.mark.parametrize("spec_rate, gap", [(90, PROBE_EVERY), (80, 32), (50, 80), (2, 157)])
def test_probes_are_spaced_by_how_far_apart_the_arms_lie(spec_rate, gap):
    """A probe the step model runs against the verdict costs about the arms' margin of one decode: the first probe
    comes margin / PROBE_COST decided decodes after the verdict (PROBE_EVERY up to a 10% margin), and one that
    confirms the verdict doubles the gap from there (at most PROBE_MAX)."""
    from domino_graft.decoding.outcomes import PROBE_COST

    assert round(0.1 / PROBE_COST) == PROBE_EVERY
    seen = Outcomes()
    for _ in range(OUTCOME_WINDOW):  # both windows full: a verdict whatever the spread
        seen.add(8, "spec", spec_rate, 1.0)
        seen.add(8, "plain", 100, 1.0)
    arms = []
    while len(arms) < 3 * gap + 2 and arms.count(None) < 2:
        arm = seen.arm_for(8)
        arms.append(arm)
        seen.add(8, "spec" if arm is None else arm, spec_rate if arm is None else 100, 1.0)
    probes = [i for i, a in enumerate(arms) if a is None]
    assert probes == [gap - 1, gap + min(2 * gap, PROBE_MAX) - 1], (spec_rate, probes)
    assert {a for a in arms if a is not None} == {"plain"}


@pytest.mark.parametrize("switch, gap", [(0.0, 80), (0.5, 160), (2.4, 256)])
def test_a_served_windows_switch_of_arms_spaces_its_probes_too(switch, gap):
    """A served window pays a switch of arms before it (the drafter's catch-up after plain windows, left out of its
    wall): a probe then costs the margin and the switch, in windows, and its gap is their sum over PROBE_COST (at most
    PROBE_MAX). The switches are a share of the window's own wall (`add`'s `switch` over its `seconds`)."""
    seen = Outcomes()
    for i in range(OUTCOME_WINDOW):  # both windows full: a verdict (plain, 50% apart)
        seen.add(8, "spec", 50, 1.0, switch=switch if i else 0.0)  # (the first speculative window had no switch)
        seen.add(8, "plain", 100, 1.0)
    arms = [seen.arm_for(8) for _ in range(gap)]
    assert arms.index(None) == gap - 1 and set(arms[:-1]) == {"plain"}
