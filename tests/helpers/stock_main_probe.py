"""Run verl's STOCK ``verl.trainer.main_ppo.main`` (its hydra decorator, config path, our hydra plugins
and callbacks, all real) for several command lines in one process, with the training launch
replaced by a recorder; print what the task function received, as JSON.

    python -m tests.helpers.stock_main_probe '[["reward_model.reward_manager=async_agent"], ...]' [--without-plugin]

``--without-plugin`` switches this package's hydra search-path plugin off, i.e. verl as if
verl-async-rm were not installed. Used by tests/seam/test_legacy_config.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> None:
    cases = json.loads(sys.argv[1])
    if "--without-plugin" in sys.argv:
        from verl_async_rm.integration.stock_entry import VerlConfigSearchPath

        VerlConfigSearchPath.manipulate_search_path = lambda self, search_path: None

    import verl.trainer.main_ppo as stock
    from omegaconf import OmegaConf

    received: list = []
    stock.run_ppo = lambda config, task_runner_class: received.append(OmegaConf.to_container(config))
    stock.validate_config = lambda **kwargs: None  # checks batch sizes against GPUs; not what is probed

    results = []
    for overrides in cases:
        received.clear()
        sys.argv = ["main_ppo", *overrides, "hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none",
                    "hydra/hydra_logging=none"]
        err = io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err):
            try:
                stock.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
                if not isinstance(exc.code, int) and exc.code is not None:
                    err.write(str(exc.code))
        results.append({"config": received[0] if received else None, "exit": code, "stderr": err.getvalue()})
    print("PROBE" + json.dumps(results))


if __name__ == "__main__":
    main()
