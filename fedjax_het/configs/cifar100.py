"""CIFAR-100 federated class-incremental learning (GLFC, CVPR 2022): FedAvg, iCaRL+FL, GLFC.

Commands (from the repository root):

  python experiments/train.py --config=cifar100_fedavg_cil_quick   # minutes on a 2-core CPU
  python experiments/train.py --config=cifar100_fedavg_cil         # GLFC Table 1 setting, T=10
  python experiments/train.py --config=cifar100_icarl_fl_quick     # minutes on a 2-core CPU
  python experiments/train.py --config=cifar100_icarl_fl           # GLFC Table 1 setting, T=10
  python experiments/train.py --config=cifar100_glfc_quick         # minutes on a 2-core CPU
  python experiments/train.py --config=cifar100_glfc               # GLFC Table 1 setting, T=10
  python experiments/train.py --config=cifar100_glfc_tasks5        # T=5 (20 classes per task)
  python experiments/train.py --config=cifar100_glfc_tasks20       # T=20 (5 classes per task)

Variant names: <method>[_tasks<T>] and <method>_quick, method in fedavg_cil, icarl_fl,
glfc, glfc_no_cgc, glfc_no_crd, ssil_fl, bic_fl, podnet_fl, dde_icarl_fl, geodl_icarl_fl
and T in 5, 10, 20 (no suffix:
T = 10, GLFC Table 1; _tasks10 is the same setting under another name). _tasks<T> sets
scenario.num_tasks = T (100 / T classes per task) and keeps everything else: 30 clients at
the start, 10 new clients per task, each client drawing 60% of its task's classes, 10
rounds per task. The paper's text gives these
numbers for every T; the authors' code instead adds task_size new clients per task and
always draws 6 classes per client, which cannot run at T = 20 (5 classes per task), so
the paper's text is followed. The quick variants exist for T = 4 only (their own 20-class
stream); <method>_tasks<T>_quick is not a variant.

iCaRL + FL (fedjax_het/algorithms/icarl_fl.py; GLFC Table 1 row "iCaRL + FL"): every client runs
iCaRL (exemplar memory of 2000 distinct images per client by herding at its task
transitions, read from the stream; sigmoid BCE over the seen classes with the old
model's sigmoid outputs as targets on the old classes, the old model being the global
model at the end of the previous task; nearest-mean-of-exemplars classifier whose class
means are federated statistics of the sampled clients), FedAvg of the models. Local SGD
lr 2.0 like glfc (the same class-averaged sigmoid BCE). icarl_fl_quick: the
fedavg_cil_quick stream and model with a memory of 90 images per client and lr 0.5
(glfc_quick's values; not tuned for iCaRL).

SS-IL + FL (fedjax_het/algorithms/ssil_fl.py; GLFC Table 1 row "SS-IL + FL"): every client
runs SS-IL (separated softmax over the new classes for new data and over the old classes
for exemplars, task-wise KD at T = 2 from the global model at the end of the previous task,
ratio-preserving batches of 128 new rows plus ceil(128 * memory / n_max) exemplars), with
iCaRL + FL's memory (2000 distinct images per client by herding), FedAvg of the models.
Softmax cross-entropy: local lr 0.1 as fedavg_cil. ssil_fl_quick: the fedavg_cil_quick
stream and model with a memory of 90 images per client.

BiC + FL (fedjax_het/algorithms/bic_fl.py; GLFC Table 1 row "BiC + FL"): every client runs
BiC's first stage (softmax CE over the seen classes and KD at T = 2 on the old classes,
lambda * L_d + (1 - lambda) * L_c with lambda = n_old / n_seen, the old model's outputs
through its task's bias layer) with iCaRL + FL's memory, less a class-balanced validation
split (10% of every class's exemplar share, from the exemplars and the new data); at the
last round of every task t >= 1 the sampled clients fit that task's bias pair (alpha,
beta) on their splits under the new global model and the server averages the pairs.
Local lr 0.1 as fedavg_cil.
bic_fl_quick: the fedavg_cil_quick stream and model with a memory of 90 images per client.

PODNet + FL (fedjax_het/algorithms/podnet_fl.py; Douillard et al., ECCV 2020, federated as
GLFC's paper federates every baseline): every client runs PODNet (local similarity
classifier with 10 proxies per class and a learned scale, NCA loss with margin 0.6, and
from task 1 on POD-flat (weight 1) and POD-spatial over the backbone's stage outputs
(weight 3), both scaled by sqrt(seen classes / new classes), against the global model at
the end of the previous task) with iCaRL + FL's memory; FedAvg of the models and the
classifier. Local lr 0.1 as fedavg_cil. podnet_fl_quick: the fedavg_cil_quick stream and
model (simple_cnn's two conv stages for POD-spatial) with a memory of 90 images per client.

DDE + iCaRL + FL (fedjax_het/algorithms/dde_icarl_fl.py; Hu et al., CVPR 2021, federated as
GLFC's paper federates every baseline): iCaRL + FL whose clients train with DDE's
colliding-effect distillation (from task 1 on, each row's prediction on the new-class
columns is 1/2 its own sigmoid output plus 1/2 the mean of those of its 10 nearest new-class
rows of the batch in the old model's normalised feature space) and accumulate DDE's feature
momentum (mu 0.9, averaged with the model); the NME classifier removes the momentum effect
(alpha 0.5) from the test features. iCaRL's sigmoid BCE: local lr 2.0 as icarl_fl.
dde_icarl_fl_quick: icarl_fl_quick's memory (90 images per client) and lr 0.5.

GeoDL + iCaRL + FL (fedjax_het/algorithms/geodl_icarl_fl.py; Simon et al., CVPR 2021,
federated as GLFC's paper federates every baseline): iCaRL + FL whose clients add GeoDL's
geodesic distillation from task 1 on: the old and new model's L2-normalised features of a
batch span subspaces of dimension min(batch, feature dim) - 2 (top singular vectors), and
the loss is 1 - the cosine of each row's old and new feature under the geodesic flow kernel
between the two subspaces, weighted lambda * sqrt(old classes / new classes) with lambda = 5
(the GeoDL code's; not tuned at this scale). iCaRL's sigmoid BCE: local lr 2.0 as icarl_fl.
geodl_icarl_fl_quick: icarl_fl_quick's memory (90 images per client), lr 0.5 and lambda = 1
(lambda = 5 lowers both the old and the new classes' accuracy of this small model).

Learning-rate schedule within a task (local.lr_schedule = "glfc_code", every full-size
variant): the GLFC code's step decays, lr / 5, lr / 25, lr / 125 from the in-task epochs
100, 150, 180 of 200 to the end of the round they fall in
(fedjax_het.cil.stream.epoch_learning_rates; at 0.5, 0.75, 0.9 of the task's epochs in
other settings). The quick variants train at the constant base lr: with 5 rounds of 5
epochs per task the decays leave 12 full-rate epochs per task (glfc_quick after task 0:
22.4 with the schedule, 30.4 without). --config.local.lr_schedule=constant|glfc_code
switches.

GLFC variants (fedjax_het/algorithms/glfc.py, fedjax_het/cil/proxy.py): glfc is the fedavg_cil
setting with GLFC: exemplar memory of 2000 images per client (iCaRL herding; stored as
pool indices), task-transition detection by the entropy rule (Eq. 7, r_h = 1.2), local
objective 0.5 * L_GC + 0.5 * L_RD (L_GC alone in the first task), sigmoid BCE over the
seen classes, SGD lr 2.0 (the code's), weight decay 1e-5, and the proxy server
(glfc.old_model = "proxy"): signalling clients share one perturbed-prototype LeNet
gradient per class (50 SGD steps at lr 0.2, feature noise gamma 0.1), the proxy
reconstructs them (2000 L-BFGS iterations, fixed step 1.0, the last 20 iterates kept as
monitor images) and hands out the best global models on them as the old models of L_RD.
GLFC Table 1's ablations: glfc_no_cgc ("Ours-w/oCGC": glfc.use_gradient_compensation =
False, plain class-averaged sigmoid BCE instead of L_GC), glfc_no_crd ("Ours-w/oCRD":
glfc.use_relation_distillation = False, iCaRL's KD on the old classes instead of L_RD),
each with the _tasks<T> and _quick forms of glfc;
--config.glfc.old_model=previous_task_global is the ablation without the proxy (the old
model is the global model at the end of the previous task);
--config.glfc.proxy.rebuild=new_classes rebuilds the proxy's monitor set only from
gradients of classes it has not reconstructed before (the paper's text; the code rebuilds
on any gradient). GLFC's protocol as the paper's text gives it, three switches (defaults:
the code's protocol, the recorded runs): --config.scenario.client_roles=per_round (old /
in-between / new clients re-drawn at every global round, new clients joining at any round
of their task; fedjax_het.cil.stream.draw_round_roles), --config.glfc.update_all_clients=True
(every joined client updates its entropy and exemplar memory every round, Sec. 4.3) and
--config.glfc.proxy.shuffle_gradients=True (the proxy shuffles the round's gradient pool,
Sec. 4.2; other dummy draws, so other numbers). The quick cells of GLFC Table 1 over 3 seeds
are in docs/results.md (python experiments/reproduce.py --table=glfc_table1 --scale=quick).
glfc_quick: the fedavg_cil_quick stream and model with a memory of 90 images per client,
local lr 0.5 (with GLFC's lr 2.0 this small simple_cnn stays at chance after task 0),
transitions read from the stream, and 600 reconstruction iterations (CPU time; 20-27 dB
after 1000 on CIFAR-100 images). The entropy rule (glfc.transition="entropy", r_h = 1.2)
is calibrated for a trained ResNet-18 and 10 classes per task: this weak
5-classes-per-task model's entropy on its own data stays near 0.9-1.6 (log 5 = 1.61), so
the rise to the next task stays below 1.2 and the rule misses the transitions; the quick
variant therefore takes transitions from the stream so that the exemplar memory is
exercised; --config.glfc.transition=entropy restores the rule (metrics.jsonl reports
glfc/transitions/{true,detected,hit,false} either way).

Variants: fedavg_cil (GLFC's CIFAR-100 setting: T = 10 tasks of 10 classes, 30 clients
at the start and 10 more per task, 10 sampled per round, 10 rounds per task, CIFAR
ResNet-18 (glfc_resnet18), local SGD lr 0.1 (see below), weight decay 1e-5, 20 local
epochs, batch 128) and fedavg_cil_quick (20 classes in 4
tasks, 6 clients + 2 per task, 3 per round, 5 rounds per task, simple_cnn, 5 epochs of
batch 64, SGD lr 0.1). The method: FedAvg on the task stream (fine-tuning: no exemplars, no
distillation), local softmax cross-entropy over the classes seen so far; see
fedjax_het/algorithms/fedavg_cil.py. results.md: accuracy on all seen classes after every task, its
average (GLFC's "Avg.") and the average forgetting.

Mid variants (<method>_mid, GLFC Table 1's T = 10; `reproduce.py --table=glfc_table1
--scale=mid`): the paper setting above (100 classes in 10 tasks, 30 clients and 10 more per
task, 10 a round, 10 rounds a task, the paper's learning rates and schedule) with the CIFAR
ResNet-18 at width 1/8 (`MID_WIDTH`), 2 local epochs a round instead of 20 (`MID_EPOCHS`),
an exemplar memory of 480 images per client instead of 2000 (`MID_MEMORY`: the bundle has
120 training images a class against the official 500, so a client holds 720 images a task
instead of 3000; 480 = 2000 x 120/500 keeps the memory below the client's old data, so
herding selects, as in the paper) and GLFC's transitions read from the stream as in the
quick variants (the entropy rule is calibrated for the full-width model). Cost on a 2-core
CPU, the first task's rounds: FedAvg 25.8 s a round (43 minutes a cell;
`benchmarks/results/round_cost__glfc_mid__cpu2.json`); in one run
(`benchmarks/results/round_cost__glfc_mid_parts__cpu2.json`) iCaRL + FL 35.1 s (59 minutes)
and GLFC 229.8 s (6.4 hours at that round), which breaks down as its clients' training 33.7 s
(GLFC without the proxy, `glfc.old_model=previous_task_global`), the proxy's other work 12.1 s
(the clients' perturbed prototypes and gradients, the monitor set; GLFC with 20 reconstruction
iterations: 45.8 s) and the proxy's reconstructions 184 s (80% of the round: 1980 L-BFGS
iterations on the 54-60 gradients that 9-10 signalling clients share in these rounds, 1.55 ms
a gradient an iteration), measured with the pool of 10 clients x 6 class slots reconstructed
whole whenever one gradient arrives and stock convolutions in the encoder
(`glfc.proxy.reconstruction_chunk=0`, `glfc.proxy.encoder_conv_impl="xla"`, the defaults).
The mid configs reconstruct the slots in use only, one client's 6 at a time, with im2col
convolutions in the encoder (`MID_RECONSTRUCTION_CHUNK`, `MID_ENCODER_CONV_IMPL`): on the mid
pool at 2000 iterations 7 s for one signalling client's 6 gradients, 20 s for three clients'
and 65 s for ten clients' 60, where the whole pool with stock convolutions costs 131-134 s
whatever it holds (`benchmarks/results/proxy_reconstruction__glfc_mid_pool__cpu2.json`, 100
iterations timed). A client signals in the first round it trains in each task, so a task's
later rounds have fewer signalling clients than its first. The first task distils from no old
model, so later tasks cost more.

Class order (scenario.class_order; fedjax_het/data/incremental.py): every full-size variant
uses "icarl", iCaRL's seed-1993 CIFAR-100 order (incremental.ICARL_CIFAR100_ORDER, from
srebuffi/iCaRL), which GLFC's paper says it follows and PODNet's code
(arthurdouillard/incremental_learning.pytorch) uses. The authors' GLFC code trains on the
ascending labels ("identity"); --config.scenario.class_order=identity|seeded switches. The
quick variants keep "seeded" (a seeded random 20-class subset and order; iCaRL's order
needs real CIFAR-100 labels).

Data: cifar100_glfc.npz of the offline bundle (FEDJAX_HET_DATA_DIR or
--config.scenario.data_dir): 120 training / 50 test images per class, NOT the official
split. The quick variant falls back to synthetic (domain, digit) classes without it
(logged loudly, recorded in metadata.json and results.md); its numbers then say nothing
about CIFAR-100.

Learning rate: GLFC's code uses SGD lr 2.0 with a sigmoid BCE averaged over the seen
classes, whose gradient per logit is 1/num_seen of softmax cross-entropy's (an effective
rate of 0.2 at 10 seen classes, 0.02 at 100). This baseline trains with softmax
cross-entropy, so lr 2.0 is too large: on a narrow proxy (glfc_resnet18 width 1/8, the
quick stream, 2 epochs) the first round's local loss was 4.09 at lr 2.0 (above the
uniform 1.61) against 1.03 at lr 0.1, and the lr 2.0 model predicted a single class after
every task. lr 0.1 is used; --config.local.lr=2.0 restores GLFC's value. Not yet checked at
full scale (needs an accelerator).

Expected: the fine-tuning baseline forgets old tasks almost entirely, so
the accuracy after task t is about (accuracy on the newest task) / (t + 1).
"""

from __future__ import annotations

import ml_collections

from fedjax_het.config import base_config

#: GLFC Table 1's ablation rows: the glfc config with one component switched off.
GLFC_ABLATIONS = {
    "glfc_no_cgc": (("use_gradient_compensation", False),),   # Ours-w/oCGC
    "glfc_no_crd": (("use_relation_distillation", False),),   # Ours-w/oCRD
}
#: The softmax baselines of GLFC Table 1 with an exemplar memory (local lr 0.1, as fedavg_cil).
SOFTMAX_REPLAY = ("ssil_fl", "bic_fl", "podnet_fl")
METHODS = ("fedavg_cil", "icarl_fl", "glfc", *GLFC_ABLATIONS, *SOFTMAX_REPLAY, "dde_icarl_fl",
           "geodl_icarl_fl")
#: Task counts of the _tasks<T> variants (T = 10, the paper's Table 1, is also the default).
TASK_COUNTS = (5, 10, 20)
VARIANTS = tuple(name for method in METHODS
                 for name in (method, *(f"{method}_tasks{t}" for t in TASK_COUNTS),
                              f"{method}_quick", f"{method}_mid"))
#: The mid scale (`_mid`, GLFC Table 1's T = 10): backbone width, local epochs per round and
#: exemplar memory per client (module docstring, "Mid variants").
MID_WIDTH, MID_EPOCHS, MID_MEMORY = 0.125, 2, 480
#: GLFC's proxy at mid scale: its reconstructions of the used gradients only, one signalling
#: client's slots (6) at a time, with im2col convolutions in the encoder (module docstring).
MID_RECONSTRUCTION_CHUNK, MID_ENCODER_CONV_IMPL = 6, "im2col"


def _parse(arg: str) -> tuple[str, int | None, str]:
  """`arg` -> (method, number of tasks or None for the default, scale: "", "quick", "mid")."""
  if arg not in VARIANTS:
    raise ValueError(f"cifar100 config: expected one of {VARIANTS} (<method>[_tasks<T>], "
                     f"<method>_quick or <method>_mid), got {arg!r}.")
  scale = next((s for s in ("quick", "mid") if arg.endswith(f"_{s}")), "")
  name = arg.removesuffix(f"_{scale}") if scale else arg
  method, _, tasks = name.partition("_tasks")
  return method, (int(tasks) if tasks else None), scale


def _memory_section(method: str) -> str | None:
  """The config section holding `method`'s exemplar memory size (None: no memory)."""
  if method in ("glfc", *GLFC_ABLATIONS):
    return "glfc"
  if method in SOFTMAX_REPLAY:
    return method.removesuffix("_fl")
  return {"icarl_fl": "icarl", "dde_icarl_fl": "dde", "geodl_icarl_fl": "geodl"}.get(method)


def get_config(arg: str = "fedavg_cil") -> ml_collections.ConfigDict:
  """`arg`: one of `VARIANTS` (module docstring)."""
  variant, num_tasks, scale = _parse(arg)
  quick = scale == "quick"
  method = "glfc" if variant in GLFC_ABLATIONS else variant
  c = base_config(method)
  c.name = f"cifar100_{arg}"
  memory = _memory_section(method)
  if method == "fedavg_cil" or method in SOFTMAX_REPLAY:
    c.local.lr = 0.1  # softmax cross-entropy, not GLFC's class-averaged BCE (docstring)
  else:
    c.local.lr = 2.0  # GLFC's code: sigmoid BCE averaged over the seen classes
  if num_tasks is not None:
    c.scenario.num_tasks = num_tasks  # 100 / T classes per task; clients as the paper's text
  if not quick:
    c.scenario.class_order = "icarl"  # the order GLFC's paper reports on (docstring)
  if quick:
    c.scenario.synthetic_fallback = True
    c.scenario.num_tasks = 4
    c.scenario.num_classes = 20
    c.scenario.initial_clients = 6
    c.scenario.new_clients_per_task = 2
    c.cil.rounds_per_task = 5
    c.cil.clients_per_round = 3
    c.models.architectures = ("simple_cnn",)
    c.local.epochs = 5
    c.local.batch_size = 64
    c.checkpoint.every = 5
    # The code's decays sit at 50/75/90% of a task's local epochs: with 5 rounds of 5 epochs
    # only 12 epochs per task run at the full rate (glfc_quick after task 0: 22.4 with the
    # schedule, 30.4 without; docstring).
    c.local.lr_schedule = "constant"
    if memory:
      c[memory].memory_size = 90  # glfc_quick: 30 per class after the first task (3 a client)
    if method == "glfc":
      c.local.lr = 0.5         # lr 2.0 stayed at chance (20.0) after task 0 (docstring)
      c.glfc.transition = "stream"  # the entropy rule never fired here (docstring)
      c.glfc.proxy.reconstruction_steps = 600  # CPU time (docstring)
    if method in ("icarl_fl", "dde_icarl_fl", "geodl_icarl_fl"):
      c.local.lr = 0.5          # as glfc_quick (the same sigmoid BCE)
    if method == "geodl_icarl_fl":
      c.geodl.weight = 1.0      # 5 kept the new classes from being learned (docstring)
  if scale == "mid":
    c.models.width = MID_WIDTH
    c.local.epochs = MID_EPOCHS
    if memory:
      c[memory].memory_size = MID_MEMORY
    if method == "glfc":
      c.glfc.transition = "stream"  # as every other row: the narrow model's entropy (docstring)
      c.glfc.proxy.reconstruction_chunk = MID_RECONSTRUCTION_CHUNK  # CPU time (docstring)
      c.glfc.proxy.encoder_conv_impl = MID_ENCODER_CONV_IMPL
  for field, value in GLFC_ABLATIONS.get(variant, ()):
    c.glfc[field] = value
  return c
