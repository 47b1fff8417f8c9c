"""``python -m verl_async_rm_rig.cpu_backend.entry``: our entry point as the launcher runs it.

A run whose ``CPURunConfig.entry_module`` is ``verl_async_rm.main_ppo`` is started through this module.
It does what that entry point does (the same argument handling, then its ``prepare`` and ``run``) and two
things only the rig wants, which the product knows nothing of:
- the light driver (``LIGHT_DRIVER_ENV``, light_driver.py): the run driven without importing verl here;
- the finish marker (finish_marker.py): written once verl's run has returned, so the launcher can end
  the run's processes instead of sitting through Ray's teardown.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from verl_async_rm import main_ppo

from .finish_marker import mark_finished
from .names import LIGHT_DRIVER_ENV


@hydra.main(config_path="pkg://verl_async_rm.hydra_conf", config_name=main_ppo.CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    settings = main_ppo.prepare(config)
    if os.environ.get(LIGHT_DRIVER_ENV) == "1":
        from . import light_driver

        light_driver.run(config, main_ppo.task_runner(settings))
    else:
        main_ppo.run(config, settings)
    mark_finished()  # only when the launcher asked for a marker


def cli() -> None:
    main_ppo.refuse_unsupported_verl()
    sys.argv[1:] = main_ppo.accept_recipe_spellings(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
