"""GLFC privacy report (experiments/glfc_privacy.py): scores, summary, verdict, end to end."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.studies import privacy
from fedjax_het.config import load_module
from fedjax_het.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _sample(**fields):
  """One per-sample record with neutral defaults (every SAMPLE_COLUMNS / MEAN_KEYS field)."""
  base = {"class_index": 0, "class_name": "apple", "label_raw_ok": True,
          "label_perturbed_ok": True, "psnr_perturbed": 30.0, "ssim_perturbed": 0.9,
          "psnr_rec_raw": 40.0, "ssim_rec_raw": 0.99, "psnr_rec_perturbed": 29.0,
          "ssim_rec_perturbed": 0.88, "psnr_rec_perturbed_vs_sent": 38.0,
          "correct_original": True, "correct_perturbed": True, "correct_rec_raw": True,
          "correct_rec_perturbed": True, "max_abs_perturbation": 0.1}
  base.update(fields)
  return base


def _means(**fields):
  return privacy.summarize([_sample(**fields)])


# --- summary and table ------------------------------------------------------------------


def test_summarize_means_hand_numbers_and_table_rows():
  samples = [_sample(class_index=3, class_name="bear", psnr_rec_raw=30.0, ssim_rec_raw=0.8,
                     label_perturbed_ok=False, correct_rec_perturbed=False),
             _sample(class_index=7, class_name="beetle", psnr_rec_raw=41.0, ssim_rec_raw=0.9,
                     correct_rec_perturbed=True)]
  means = privacy.summarize(samples)
  assert means["psnr_rec_raw"] == pytest.approx(35.5)
  assert means["ssim_rec_raw"] == pytest.approx(0.85)
  assert means["label_perturbed_ok"] == 0.5 and means["label_raw_ok"] == 1.0
  assert means["correct_rec_perturbed"] == 0.5
  assert set(means) == set(privacy.MEAN_KEYS)
  lines = privacy.samples_table(samples, means)
  assert len(lines) == 2 + 2 + 1  # header, rule, two samples, means
  cells = [c.strip() for c in lines[2].strip("|").split("|")]
  assert cells[:4] == ["3", "bear", "yes", "no"]
  assert cells[6] == "30.00" and cells[7] == "0.800"
  mean_cells = [c.strip() for c in lines[-1].strip("|").split("|")]
  assert mean_cells[0] == "**mean**" and mean_cells[1] == ""
  assert mean_cells[3] == "0.50" and mean_cells[6] == "35.50" and mean_cells[7] == "0.850"
  with pytest.raises(ValueError, match="no samples"):
    privacy.summarize([])


# --- verdict ------------------------------------------------------------------------------


def test_verdict_protects_only_with_a_large_psnr_drop_and_low_ssim():
  strong = privacy.verdict(_means(psnr_rec_raw=40.0, psnr_rec_perturbed=25.0,
                                  ssim_rec_perturbed=0.3))
  assert strong["attack_works"] and strong["protects"] is True
  assert strong["psnr_drop_db"] == pytest.approx(15.0)
  assert "PROTECTS" in strong["text"]
  # Exactly the threshold drop counts; SSIM exactly at the threshold does not.
  assert privacy.verdict(_means(psnr_rec_raw=35.0, psnr_rec_perturbed=25.0,
                                ssim_rec_perturbed=0.49))["protects"] is True
  assert privacy.verdict(_means(psnr_rec_raw=35.0, psnr_rec_perturbed=25.0,
                                ssim_rec_perturbed=0.5))["protects"] is False
  weak = privacy.verdict(_means(psnr_rec_raw=40.0, psnr_rec_perturbed=37.0,
                                ssim_rec_perturbed=0.3))
  assert weak["protects"] is False and "does NOT protect" in weak["text"]
  assert "the PSNR drop is only 3.0 dB" in weak["text"] and "SSIM stays" not in weak["text"]
  similar = privacy.verdict(_means(psnr_rec_raw=45.0, psnr_rec_perturbed=30.0,
                                   ssim_rec_perturbed=0.9))
  assert similar["protects"] is False and "the SSIM stays at 0.90" in similar["text"]
  assert "PSNR drop is only" not in similar["text"]


def test_verdict_is_inconclusive_when_even_the_raw_attack_fails():
  result = privacy.verdict(_means(psnr_rec_raw=12.0, psnr_rec_perturbed=8.0,
                                  ssim_rec_perturbed=0.05))
  assert result["attack_works"] is False and result["protects"] is None
  assert result["text"].startswith("Inconclusive")


def test_verdict_usefulness_tolerance_and_weak_classifier():
  def useful(orig, rec, chance=None):
    samples = [_sample(correct_original=o, correct_rec_perturbed=r) for o, r in zip(orig, rec)]
    return privacy.verdict(privacy.summarize(samples), chance=chance)

  eight = [True] * 6 + [False] * 2  # 75% on the originals
  assert useful(eight, eight)["useful"] is True
  assert useful(eight, [True] * 5 + [False] * 3)["useful"] is False  # 12.5 points lower
  assert useful(eight, [True] * 5 + [False] * 3)["accuracy_drop"] == pytest.approx(0.125)
  assert useful(eight, [True] * 8)["useful"] is True  # better than the originals
  # 75% vs chance 70%: within the tolerance of chance, cannot be judged.
  result = useful(eight, eight, chance=0.7)
  assert result["useful"] is None and "CANNOT BE JUDGED" in result["text"]
  assert useful(eight, eight, chance=0.1)["useful"] is True


# --- image scores, prototypes, JSON ------------------------------------------------------


def test_image_scores_quantize_clip_and_cap_identical_images():
  rng = np.random.default_rng(0)
  original = rng.integers(0, 230, size=(2, 16, 16, 3)).astype(np.uint8)
  x = jnp.asarray(original, jnp.float32) / 255.0
  perturbed = x + 26.0 / 255.0 + 0.3 / 255.0  # rounds to +26 levels everywhere
  rec_perturbed = x + 5.0  # clipped to 1
  scores = privacy.image_scores(original, perturbed, x, rec_perturbed)
  np.testing.assert_allclose(scores["psnr_perturbed"], 20 * np.log10(255.0 / 26.0), rtol=1e-5)
  np.testing.assert_array_equal(scores["psnr_rec_raw"], [privacy.PSNR_CAP_DB] * 2)
  np.testing.assert_allclose(scores["ssim_rec_raw"], [1.0, 1.0], atol=1e-6)
  ones = np.ones_like(original, np.float64)
  mse = np.mean(np.square(ones - original / 255.0), axis=(1, 2, 3))
  np.testing.assert_allclose(scores["psnr_rec_perturbed"], 10 * np.log10(1.0 / mse), rtol=1e-5)
  sent = np.clip(original.astype(np.float64) + 26, 0, 255) / 255.0
  mse_sent = np.mean(np.square(ones - sent), axis=(1, 2, 3))
  np.testing.assert_allclose(scores["psnr_rec_perturbed_vs_sent"], 10 * np.log10(1.0 / mse_sent),
                             rtol=1e-5)
  assert np.all(scores["ssim_perturbed"] < 1.0) and np.all(scores["ssim_perturbed"] > 0.5)
  # A float original gives the same scores as its uint8 form.
  again = privacy.image_scores(x, perturbed, x, rec_perturbed)
  for key, value in scores.items():
    np.testing.assert_allclose(again[key], value, rtol=1e-6)


def test_class_prototypes_match_numpy_nearest_to_normalised_mean_and_variance():
  rng = np.random.default_rng(1)
  features = rng.normal(size=(30, 6)) + 2.0
  labels = np.repeat([0, 1, 2], 10)
  rows, variances = privacy.class_prototypes(features, labels, [2, 0])
  for i, c in enumerate([2, 0]):
    idx = np.nonzero(labels == c)[0]
    f = features[idx] / np.linalg.norm(features[idx], axis=1, keepdims=True)
    assert rows[i] == idx[np.argmin(np.linalg.norm(f - f.mean(axis=0), axis=1))]
    np.testing.assert_allclose(variances[i], features[idx].var(axis=0), rtol=1e-4)
  with pytest.raises(ValueError, match=r"no example of class\(es\) \[5\]"):
    privacy.class_prototypes(features, labels, [5])


def test_json_safe_converts_numpy_and_non_finite_values():
  got = privacy.json_safe({"a": np.float32(1.5), "b": [np.int64(3), np.bool_(True)],
                           "c": float("inf"), "d": (np.nan, "x")})
  assert got == {"a": 1.5, "b": [3, True], "c": None, "d": [None, "x"]}
  json.dumps(got, allow_nan=False)


def test_train_classifier_learns_two_colours_and_predict_agrees():
  rng = np.random.default_rng(2)
  labels = np.repeat([0, 1], 32)
  images = np.where(labels[:, None, None, None] == 0, 40, 210)
  images = np.clip(images + rng.integers(-20, 21, size=(64, 32, 32, 3)), 0, 255).astype(np.uint8)
  model = models.get_model("simple_cnn", 2, width=0.5, conv_impl="im2col")
  variables, epoch_losses = privacy.train_classifier(
      model, images, labels, jax.random.key(0), epochs=6, batch_size=16,
      learning_rate=0.1, preprocess=lambda x: (x - 0.5) / 0.25)
  assert epoch_losses.shape == (6,)
  assert epoch_losses[0] > 0.6 and epoch_losses[-1] < 0.1  # ln 2 -> ~0 (measured 0.69 -> 0)
  pred = privacy.predict(model, variables, images, preprocess=lambda x: (x - 0.5) / 0.25)
  assert np.mean(pred == labels) == 1.0
  with pytest.raises(ValueError, match="`batch_size` must be in"):
    privacy.train_classifier(model, images, labels, jax.random.key(0), epochs=1,
                             batch_size=65, preprocess=lambda x: x)


# --- the script -------------------------------------------------------------------------


@pytest.fixture()
def script(monkeypatch):
  monkeypatch.delenv("FEDJAX_HET_DATA_DIR", raising=False)
  return load_module(ROOT / "experiments" / "glfc_privacy.py")


def test_script_rejects_more_samples_than_first_task_classes(script, tmp_path):
  args = script.parse_args(["--synthetic_fallback", "--num_classes=20", "--num_tasks=4",
                            "--samples=6", f"--out={tmp_path}"])
  with pytest.raises(ConfigError, match="--samples=6 exceeds the 5 classes"):
    script.run_report(args, echo=lambda _: None)
  assert script.main(["--perturb_input=clip", f"--out={tmp_path}"]) == 1
  assert not (tmp_path / "privacy.json").exists()


def test_markdown_and_grid_from_a_hand_report(script, tmp_path):
  samples = [_sample(class_index=1, class_name="bee", psnr_rec_perturbed=21.5),
             _sample(class_index=4, class_name="bus", correct_rec_perturbed=False)]
  means = privacy.summarize(samples)
  report = {
      "command": "python experiments/glfc_privacy.py --samples=2",
      "data": {"sources": {"cifar100": "npz:/data/cifar100_glfc.npz"}, "substituted": []},
      "classifier": {"model": "simple_cnn", "width": 1.0, "epochs": 30, "learning_rate": 0.05,
                     "batch_size": 64, "num_classes": 10, "train_size": 1200,
                     "test_accuracy": 0.614, "seconds": 15.0},
      "settings": {"samples": 2, "steps": 2000, "perturb_steps": 50, "perturb_lr": 0.2,
                   "perturb_weight_decay": 1e-5, "gamma": 0.1, "perturb_loss": "bce",
                   "perturb_input": "normalized", "seed": 0, "encoder_seed": 0,
                   "reconstruction_seed": 1},
      "samples": samples, "means": means, "verdict": privacy.verdict(means, chance=0.1),
      "timings": {"reconstruction": 230.0}, "wall_seconds": 260.0}
  text = privacy.markdown(report)
  assert "SYNTHETIC" not in text
  assert report["verdict"]["text"] in text and "does NOT protect" in text
  assert "| 1 | bee | yes | yes | 30.00 |" in text
  assert "| **mean** |" in text and "25.25" in text  # (21.5 + 29) / 2
  assert "test accuracy on the first task's classes 61.4% (chance 10.0%)" in text
  assert "50 SGD steps on the image, lr 0.2" in text and "2000 L-BFGS iterations" in text
  assert "Classes sampled: [1, 4]" in text
  assert "steps of 50.0 points" in text
  report["data"]["substituted"] = ["cifar100"]
  assert privacy.markdown(report).count("SYNTHETIC DATA") == 1
  images = np.random.default_rng(3).uniform(size=(2, 4, 32, 32, 3))
  script.plot_grid(images, samples, tmp_path / "grid.png")
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  grid = matplotlib.image.imread(tmp_path / "grid.png")
  assert grid.ndim == 3 and grid.shape[1] > grid.shape[0]  # 4 columns, 2 rows


@pytest.mark.slow  # ~30 s (compiles the training, the perturbation and the L-BFGS scan)
def test_script_end_to_end_tiny_on_synthetic_fallback(script, tmp_path):
  out = tmp_path / "report"
  assert script.main(["--synthetic_fallback", "--num_classes=20", "--num_tasks=4",
                      "--samples=2", "--steps=3", "--epochs=1", "--perturb_steps=2",
                      "--width=0.5", f"--out={out}"]) == 0
  for name in ("privacy.md", "privacy.json", "privacy_grid.png"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0
  report = json.loads((out / "privacy.json").read_text())
  assert report["data"]["substituted"] == ["cifar100"]
  assert report["settings"]["steps"] == 3 and report["settings"]["perturb_steps"] == 2
  assert len(report["samples"]) == 2
  for sample in report["samples"]:
    assert 0 <= sample["class_index"] < 5
    for key in ("psnr_perturbed", "ssim_perturbed", "psnr_rec_raw", "ssim_rec_raw",
                "psnr_rec_perturbed", "ssim_rec_perturbed", "psnr_rec_perturbed_vs_sent",
                "label_raw_ok", "label_perturbed_ok", "correct_original", "correct_rec_raw",
                "correct_rec_perturbed", "matching_loss_raw", "matching_loss_perturbed"):
      assert sample[key] is not None, key
  assert set(report["accuracy"]) == {
      "label_inference_raw", "label_inference_perturbed", "classifier_on_originals",
      "classifier_on_perturbed_prototypes", "classifier_on_rec_raw",
      "classifier_on_rec_perturbed"}
  assert report["means"]["psnr_rec_raw"] == pytest.approx(
      np.mean([s["psnr_rec_raw"] for s in report["samples"]]))
  # 3 L-BFGS iterations cannot reconstruct anything: the verdict must say so.
  assert report["verdict"]["attack_works"] is False and report["verdict"]["protects"] is None
  text = (out / "privacy.md").read_text()
  assert "SYNTHETIC DATA" in text and report["verdict"]["text"] in text
  assert text.count("\n| ") == 1 + 2 + 1  # header, 2 samples, means (the rule is "|---")
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  grid = matplotlib.image.imread(out / "privacy_grid.png")
  assert grid.shape[1] > grid.shape[0]  # 4 columns, 2 rows
