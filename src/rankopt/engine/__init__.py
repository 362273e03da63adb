"""Training engine: trainer, checkpoints, optimizers/schedulers, cross-batch memory, multistage backprop, distributed.

Import from the submodules directly (``rankopt.engine.distributed``,
``rankopt.engine.memory``, ``rankopt.engine.multistage``, ``rankopt.engine.trainer``, ...);
this package imports nothing so that ``import rankopt.engine.x`` stays light.
"""
