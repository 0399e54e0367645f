"""The run contract (fedjax_het/run_contract.py): every builder and every run the training loop
trains has every member the contract declares."""



from fedjax_het import run_contract, seed_stack
from fedjax_het.experiment import Experiment
from fedjax_het.stream_experiment import StreamExperiment
from tests.test_cil_train import tiny_cil_config
from tests.test_train import tiny_config


def _missing(instance, protocol):
  return [name for name in run_contract.members(protocol) if not hasattr(instance, name)]


def test_both_builders_and_both_runs_keep_the_contract():
  builders = [Experiment(tiny_config("solo")), StreamExperiment(tiny_cil_config())]
  for builder in builders:
    assert _missing(builder, run_contract.RunBuilder) == [], type(builder).__name__
    assert isinstance(builder, run_contract.RunBuilder)
  runs = [seed_stack.SingleRun(builders[0]), seed_stack.SingleRun(builders[1]),
          seed_stack.SeedStack([Experiment(tiny_config("solo", seed=s)) for s in (0, 1)])]
  for run in runs:
    assert _missing(run, run_contract.Run) == [], type(run).__name__
    assert isinstance(run, run_contract.Run)



def test_the_contract_declares_what_the_loop_reads():
  assert {"config", "algorithm", "data", "num_rounds", "has_public", "compile_all",
          "init_state", "restore_state", "results", "plot"} <= set(
              run_contract.members(run_contract.RunBuilder))
  assert {"experiment", "lanes", "data", "lane_state", "join", "train_records",
          "evaluation_records"} <= set(run_contract.members(run_contract.Run))
