"""The harness's Hydra sweepers (``conf/hydra/sweeper/*.yaml``): ``points``, a union of sweeps.

Hydra instantiates only sweepers that live under the ``hydra_plugins`` namespace package."""
