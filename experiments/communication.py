"""Every method's communication per round on a scenario, from one traced round (FCCL+ Tables II-IV).

  python experiments/communication.py                  # trace, record, rewrite the docs block
  python experiments/communication.py --render         # rewrite the block from the record
  python experiments/communication.py --check          # exit 1 if the block is stale

For each row of `ROWS` the scenario's config (`fedjax_het/configs/<scenario>.py`, the
paper setting) builds the method on shapes alone: zero-filled private data of one row per
participant (the counts do not depend on the private sizes), `scenario.public_size` public
images, the config's backbones and widths. One round is traced with `jax.make_jaxpr` (no
computation, no training) and its logged `train/server/bytes_up` / `bytes_down` are read
from the trace: every method logs them as constants of the round's shapes
(`fedjax_het.algorithms.common`, "Communication accounting": per round, summed over the
participants, up = client -> server). The numbers go to `RECORD` (JSON, after a header
with the commit, date and jax version) and, rendered as a
markdown table beside the paper's Table II / III entries, to the block
`<!-- communication:<scenario> -->` ... `<!-- /communication -->` of docs/communication.md;
`tests/test_communication.py` checks that the block is the rendering of the record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/communication.py` from a source checkout
  sys.path.insert(0, str(REPO))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models
from fedjax_het.algorithms import get_method
from fedjax_het.config import load_module
from fedjax_het.engine import api, clients

DOC = REPO / "docs" / "communication.md"
RECORD = REPO / "benchmarks" / "results" / "communication__{scenario}__shapes.json"
SCENARIOS = {"digits": 10}  # scenario -> classes

#: (config variant of fedjax_het/configs/<scenario>.py, with " field=value" overrides, what a
#: participant sends up / gets down on each public batch or once a round, FCCL+ Table II
#: "Comm. Cost" (Table IV for a module), Table III "Para. Space", Table II / IV Digits inter
#: accuracy). "" where the paper gives nothing.
ROWS = (
    ("solo", "nothing", "nothing", "", "", "25.68 (BASE)"),
    ("fedmd", "logits of the public subset", "consensus logits", "|B0| x C", "|θ|", "26.38"),
    ("feddf", "logits", "ensemble logits", "", "", ""),
    ("fedmatch", "weak-view logits", "the helpers' logits", "", "", ""),
    ("rhfl", "logits; private loss", "the others' logits; K weights", "", "", ""),
    ("rcfl", "class scores", "alpha-weighted aggregated scores", "", "", ""),
    ("fccl", "logits", "mean logits", "|B0| x C", "3|θ|", "33.51"),
    ("fcclplus fcclplus.use_fisl=False", "logits", "mean logits", "|B0| x C (FCCM, Table IV)",
     "|θ|", "33.51 (FCCM, Table IV)"),
    ("fcclplus", "logits; similarity logits", "their means",
     "|B0| x C + |B0|^2", "2|θ|", "50.49"),
    ("fccl_homogeneous", "logits; model", "mean logits; average model", "", "", ""),
    ("fcclplus_homogeneous", "logits; similarity logits; model",
     "their means; average model", "", "", ""),
    ("feddf_homogeneous", "logits; model", "ensemble logits; average model", "", "", ""),
    ("fedavg", "model", "global model", "|θ|", "|θ|", "-"),
    ("fedprox", "model", "global model", "|θ|", "2|θ|", "-"),
    ("moon", "model", "global model", "|θ|", "3|θ|", "-"),
    ("fedproc", "model; class prototypes", "global model; global prototypes", "", "", ""),
    ("fedrs", "model", "global model", "", "", ""),
)


def _setup(config: Any, num_classes: int) -> api.Setup:
  """The run's `Setup` from the config alone (one private row per participant)."""
  archs = list(config.models.architectures)
  num = 4 if len(archs) == 1 else len(archs)
  archs = archs * num if len(archs) == 1 else archs
  modules = [models.get_model(a, num_classes, width=float(config.models.width),
                              compute_dtype=config.models.compute_dtype) for a in archs]
  groups = clients.group_clients(archs, modules)
  stats = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
  return api.Setup(groups=groups, num_participants=num, num_classes=num_classes,
                   num_rounds=int(config.num_rounds), max_sizes={g.name: 1 for g in groups},
                   private_mean=stats[0], private_std=stats[1], public_mean=stats[0],
                   public_std=stats[1], max_test_size=1)


def _data(setup: api.Setup, num_public: int) -> api.FederatedArrays:
  k = setup.num_participants
  images = [np.zeros((1, 32, 32, 3), np.uint8)] * k
  labels = [np.zeros((1,), np.int32)] * k
  groups = {g.name: clients.stack_group_data(g, images, labels, num_participants=k, max_size=1)
            for g in setup.groups}
  public = jax.ShapeDtypeStruct((num_public, 32, 32, 3), jnp.uint8)
  return api.FederatedArrays(groups=groups, public=public, test=None)


def traced_bytes(algorithm: api.Algorithm, data: api.FederatedArrays) -> tuple[int, int]:
  """(bytes up, bytes down) that `algorithm`'s round logs, read from its trace (no run)."""
  key, index = jax.random.key(1), jnp.int32(0)
  state = jax.eval_shape(algorithm.init, jax.random.key(0), data)
  closed = jax.make_jaxpr(algorithm.round)(state, data, key, index)
  structure = jax.tree_util.tree_structure(
      jax.eval_shape(algorithm.round, state, data, key, index))
  _, metrics = jax.tree_util.tree_unflatten(structure, closed.jaxpr.outvars)
  server = metrics["server"]
  return tuple(int(np.asarray(server[name].val)) for name in ("bytes_up", "bytes_down"))


def measure(scenario: str) -> dict[str, Any]:
  """{"scenario", "public_size", "public_batch", "rows": [{variant, participants, bytes_up,
  bytes_down, ...}]}: every row of `ROWS` traced on the scenario's paper config."""
  configs = load_module(REPO / "fedjax_het" / "configs" / f"{scenario}.py")
  rows, public_size, public_batch = [], None, None
  for variant, *_ in ROWS:
    name, *overrides = variant.split()
    config = configs.get_config(name)
    for override in overrides:
      field, value = override.split("=")
      config.update_from_flattened_dict({field: json.loads(value.lower())})
    setup = _setup(config, SCENARIOS[scenario])
    num_public = int(config.scenario.public_size)
    algorithm = get_method(config.algorithm).make(config, setup)
    up, down = traced_bytes(algorithm, _data(setup, num_public))
    if "collaborative" in config:
      public_size, public_batch = num_public, int(config.collaborative.batch_size)
    rows.append({"variant": variant, "algorithm": config.algorithm,
                 "participants": setup.num_participants,
                 "architectures": sorted(set(config.models.architectures)),
                 "bytes_up": up, "bytes_down": down})
    print(f"{variant}: up {up} B, down {down} B", flush=True)
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=False).stdout.strip() or None
  header = {"commit": commit, "date": datetime.date.today().isoformat(),
            "device": "none (traced shapes, nothing runs)", "jax": jax.__version__}
  return {"header": header, "scenario": scenario, "classes": SCENARIOS[scenario],
          "public_size": public_size, "public_batch": public_batch, "rows": rows}


def _megabytes(value: int) -> str:
  return f"{value / 1e6:,.3f}"


def render(record: dict[str, Any]) -> str:
  """The markdown block of a record: one row per method."""
  paper = {row[0]: row[1:] for row in ROWS}
  lines = [
      f"Scenario {record['scenario']} (paper setting): {record['rows'][0]['participants']} "
      f"participants, C = {record['classes']} classes, N0 = {record['public_size']} public "
      f"images in batches of |B0| = {record['public_batch']}, float32; MB = 10^6 bytes per "
      "round, summed over the participants (up: client -> server).",
      "",
      "| config | sends | receives | MB up | MB down | paper comm. cost "
      "(Table II) | paper para. space (Table III) | paper Digits inter (Table II) |",
      "|---|---|---|---:|---:|---|---|---|",
  ]
  for row in record["rows"]:
    sends, receives, cost, space, accuracy = (cell.replace("|", "\\|")
                                              for cell in paper[row["variant"]])
    lines.append(f"| {row['variant']} | {sends} | {receives} | "
                 f"{_megabytes(row['bytes_up'])} | {_megabytes(row['bytes_down'])} | "
                 f"{cost} | {space} | {accuracy} |")
  return "\n".join(lines) + "\n"


def rewrite(text: str, scenario: str, block: str) -> str:
  """`text` with the scenario's block replaced by `block` (the markers must exist)."""
  begin, end = f"<!-- communication:{scenario} -->\n", "<!-- /communication -->"
  start = text.index(begin) + len(begin)
  return text[:start] + block + text[text.index(end, start):]


def block_of(text: str, scenario: str) -> str:
  begin, end = f"<!-- communication:{scenario} -->\n", "<!-- /communication -->"
  start = text.index(begin) + len(begin)
  return text[start:text.index(end, start)]


def record_path(scenario: str) -> pathlib.Path:
  return pathlib.Path(str(RECORD).format(scenario=scenario))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scenario", default="digits", choices=sorted(SCENARIOS))
  parser.add_argument("--render", action="store_true",
                      help="rewrite the docs block from the record, without tracing")
  parser.add_argument("--check", action="store_true",
                      help="exit 1 if the docs block is not the rendering of the record")
  args = parser.parse_args(argv)
  path = record_path(args.scenario)
  if not (args.render or args.check):
    path.write_text(json.dumps(measure(args.scenario), indent=1) + "\n")
  block = render(json.loads(path.read_text()))
  text = DOC.read_text()
  if args.check:
    stale = block_of(text, args.scenario) != block
    print(f"{DOC.relative_to(REPO)}: communication:{args.scenario} "
          f"{'is stale' if stale else 'is current'}")
    return 1 if stale else 0
  DOC.write_text(rewrite(text, args.scenario, block))
  print(f"wrote {'' if args.render else f'{path.relative_to(REPO)} and '}the block "
        f"communication:{args.scenario} of {DOC.relative_to(REPO)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
