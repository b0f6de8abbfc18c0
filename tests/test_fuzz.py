"""A short slice of the fuzz harness (tests/fuzz/harness.py): mutated projects of every kind
and settings files, run through settings, check, the fixer and the resolver in-process. The
full runs (minutes, several seeds) are run by hand: `python tests/fuzz/harness.py --seconds 300`."""

from fuzz.harness import KINDS, fuzz


def test_a_seeded_slice_finds_no_crash_internal_error_or_hang():
    summary = fuzz(seconds=4, seed=14, per_input=20, big=False)
    assert summary["failures"] == [], summary["failures"][:3]
    assert set(summary["inputs_per_kind"]) == set(KINDS)  # every kind got inputs
    assert summary["inputs"] >= len(KINDS)
