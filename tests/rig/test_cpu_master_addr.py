"""The CPU backend's patch of verl's ``RayWorkerGroup._get_master_addr_port`` (cpu_backend/__init__.py):
on the caller's node it gives what verl's Ray task gives (the node's IP, a free port) without
submitting the task, which would start a Ray worker process that then idles for the whole run;
off this node, and when the address is given, verl's own behaviour. On a real Ray cluster (the test
session's) with a real placement group."""

from __future__ import annotations

import socket

import pytest

from verl_async_rm_rig import cpu_backend

# ray: its fixtures use the session's Ray instance (ray_session); under `-n 2 --dist loadgroup` the scheduler
# (tests/conftest.py) then puts this module with the other Ray modules, on the worker that already started Ray
pytestmark = pytest.mark.ray


@pytest.fixture
def verl_ray_base(monkeypatch, ray_session):
    import verl.single_controller.ray.base as base

    # restored after the test: the patch replaces the class attribute
    monkeypatch.setattr(base.RayWorkerGroup, "_get_master_addr_port", base.RayWorkerGroup._get_master_addr_port)
    cpu_backend._patch_master_addr_port()
    return base


@pytest.fixture
def placement_group(ray_session):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 1}])  # verl's task asks one CPU of the bundle
    ray.get(pg.ready(), timeout=60)
    yield pg
    remove_placement_group(pg)


def _bare_worker_group(base, addr=None, port=None):
    """A RayWorkerGroup with only what the method reads (creating one for real starts workers)."""
    group = object.__new__(base.RayWorkerGroup)
    group._master_addr, group._master_port = addr, port
    return group


def test_on_this_node_it_answers_as_verls_task_without_one(verl_ray_base, placement_group, monkeypatch):
    import ray

    base = verl_ray_base
    assert cpu_backend.bundle_on_this_node(placement_group, 0)
    ours = _bare_worker_group(base)
    submitted = []
    original_options = base.get_master_addr_port.options
    monkeypatch.setattr(base.get_master_addr_port, "options",
                        lambda *a, **k: submitted.append(k) or original_options(*a, **k))
    ours._get_master_addr_port(placement_group)
    assert submitted == []  # no Ray task, so no worker process started for it
    # verl's own path (forced: the bundle is "elsewhere") runs the task, and agrees
    monkeypatch.setattr(cpu_backend, "bundle_on_this_node", lambda pg, index: False)
    verls = _bare_worker_group(base)
    verls._get_master_addr_port(placement_group)
    assert len(submitted) == 1
    assert ours._master_addr == verls._master_addr == ray.util.get_node_ip_address().strip("[]")
    assert type(ours._master_port) is type(verls._master_port)
    with socket.socket() as s:  # a port free on this node
        s.bind(("", int(ours._master_port)))


def test_a_port_range_is_honoured(verl_ray_base, placement_group):
    with socket.socket() as s:
        s.bind(("", 0))
        taken = s.getsockname()[1]
        group = _bare_worker_group(verl_ray_base)
        group._get_master_addr_port(placement_group, master_port_range=[taken, taken + 50])
    assert taken < int(group._master_port) < taken + 50  # verl's range rule: the first free port in it


def test_a_given_address_is_kept(verl_ray_base, placement_group):
    group = _bare_worker_group(verl_ray_base, "10.1.2.3", "4567")
    group._get_master_addr_port(placement_group)
    assert (group._master_addr, group._master_port) == ("10.1.2.3", "4567")
    half = _bare_worker_group(verl_ray_base, "10.1.2.3", None)
    with pytest.raises(ValueError, match="Both 'master_addr' and 'master_port'"):
        half._get_master_addr_port(placement_group)
