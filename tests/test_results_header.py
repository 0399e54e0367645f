"""results.md's heading names the rounds its numbers average (experiment.averaged_rounds_text)."""

from fedjax_het import experiment


def test_the_heading_names_the_rounds_it_averages():
  assert experiment.averaged_rounds_text([1]) == "round 1"
  assert experiment.averaged_rounds_text([3, 4, 5]) == "the mean of rounds 3, 4 and 5"
  assert experiment.averaged_rounds_text([10, 20]) == "the mean of rounds 10 and 20"
  assert experiment.averaged_rounds_text([]) == "no evaluated round"
