"""Hydra configs of verl-async-rm (a package so hydra finds them as ``pkg://hydra_conf`` once installed)."""
