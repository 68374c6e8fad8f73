"""The harness's Hydra launchers (``conf/hydra/launcher/*.yaml``): local, node_gpus, slurm.

Hydra only instantiates launchers that live under the ``hydra_plugins`` namespace package, hence
this folder at the repository root. All three end a sweep the same way (``report.py``): if any
point failed (its job raised, its record is not ``ok``, or its process was killed or crashed),
they print a summary naming each failed point and Hydra exits 1.
"""
