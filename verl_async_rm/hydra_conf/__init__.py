"""Hydra configs of verl-async-rm, found as ``pkg://verl_async_rm.hydra_conf`` (a package, so they
ship inside this package's namespace and a user's own ``hydra_conf/`` folder cannot shadow them)."""
