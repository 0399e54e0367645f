"""The runtime: how a run's round compiles and runs on this host, for every kind of run.

  compiler     RoundCompiler: the round's programs (one, per stage or per group), lowered
               through the trace cache, compiled beside the evaluation, then the compiler's
               freed memory handed back (`Experiment` and `StreamExperiment` alike)
  trace_cache  the traced and lowered round kept on disk beside the compilation cache
  programs     a staged round as one compiled program per stage or per participant group
               (config.round_programs, config.round_compile)
  resources    the convolutions "auto" picks, the low-memory fallback, the memory check
               before training, the host's resident and freed memory
  xla_cpu      XLA:CPU's instruction scheduler (memory-minimising for the paper-size rounds)
  xla_gpu      XLA:GPU's Triton GEMM switch

The engine (`fedjax_het.engine`) gives the round's blocks and wraps a method's round into
pure functions; the runtime decides how those functions become executables. It imports the
engine, never the reverse.
"""
