"""Experiments made of many training runs: the resumable grid runner, the Omniglot benchmark and the
papers' studies. Each run is an ordinary ``rankopt train`` run folder; comparisons are written by
``rankopt.report.compare``."""

from rankopt.experiments.runner import RunOutcome, RunSpec, run_grid

__all__ = ["RunOutcome", "RunSpec", "run_grid"]
