"""``python -m verl_async_rm_rig demo|score-demo|cpu``: the rig's commands.

- ``demo``: the training demo (verl's real trainer on CPU: stock ``sync``, verl's ``colocate_async`` and the
  recommended configuration against a judge that behaves like a hosted one; demo.py);
- ``score-demo``: the agent alone, scoring a generated set behind a slow simulated judge (score_demo.py);
- ``cpu``: one training run of verl on CPU with the tiny model and toy task (cpu_backend/__main__.py).
"""

from __future__ import annotations

import sys

COMMANDS = {
    "demo": "verl_async_rm_rig.demo",
    "score-demo": "verl_async_rm_rig.score_demo",
    "cpu": "verl_async_rm_rig.cpu_backend.__main__",
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
