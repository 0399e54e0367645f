"""benchmarks/fcclplus_phases.py: a FCCL+ round's time from one public step and one epoch."""

from __future__ import annotations

import pathlib

import pytest

from fedjax_het.config import load_module
from tests.test_train import tiny_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
phases = load_module(ROOT / "benchmarks" / "fcclplus_phases.py")


@pytest.mark.slow  # 15 s: it compiles a public step and a local epoch of the tiny FCCL+
def test_the_estimate_counts_the_rounds_public_steps_and_local_epochs():
  # 2 public epochs of 80 images in batches of 32: 2 ceil(80 / 32) = 6 public steps; 3 local
  # epochs.
  config = tiny_config(**{"local.epochs": 3, "scenario.public_size": 80,
                          "collaborative.epochs": 2})
  row, scenario = phases.measure(config, "im2col", repeats=1)
  assert (row["public_steps"], row["local_epochs"]) == (6, 3)
  assert row["estimated_round_secs"] == pytest.approx(
      6 * row["public_step_secs"] + 3 * row["local_epoch_secs"])
  assert row["public_step_memory_gib"] > 0 and row["local_epoch_memory_gib"] > 0
  assert len(row["public_step_all"]) == 2  # the loading call, then the timed one
  assert config.local.epochs == 3  # the caller's config is left as it was
  assert scenario.public.shape[0] == 80  # the data, for the next conv_impl to reuse


def test_a_config_of_another_method_is_refused(capsys):
  with pytest.raises(SystemExit):
    phases.main(["--config", "digits_solo_quick"])
  assert "times FCCL+'s phases" in capsys.readouterr().err
