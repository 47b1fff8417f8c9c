"""The CPU backend's rollout router (cpu_backend/router.py): verl's protocol and verl's routing,
without verl's import. Every CPU trainer run in the suite routes through it as well."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, build_overrides
from verl_async_rm_rig.cpu_backend.router import LightLoadBalancer, config_path

SERVERS = ["s0", "s1", "s2"]


@pytest.mark.local
def test_implements_every_method_of_verls_protocol_with_its_parameters():
    from verl.workers.rollout.router import GlobalRequestLoadBalancer, RequestLoadBalancer

    public = {name for name, member in vars(RequestLoadBalancer).items() if callable(member) and not name.startswith("_")}
    public |= {name for name, member in vars(GlobalRequestLoadBalancer).items() if callable(member) and not name.startswith("_")}
    assert "acquire_server" in public and "get_total_inflight" in public  # the protocol was read, not an empty set
    for name in sorted(public):
        ours = inspect.signature(getattr(LightLoadBalancer, name))
        theirs = inspect.signature(getattr(RequestLoadBalancer, name, None) or getattr(GlobalRequestLoadBalancer, name))
        named = [p for p in theirs.parameters.values() if p.kind is not p.VAR_KEYWORD]
        for param in named:
            assert param.name in ours.parameters, f"{name}: verl passes {param.name!r}"
            if param.default is not inspect.Parameter.empty:
                assert ours.parameters[param.name].default == param.default, f"{name}({param.name}=...)"


def _apply(balancer, op):
    kind, arg = op
    if kind == "acquire":
        return balancer.acquire_server(request_id=f"r{arg}")
    if kind == "release":
        return balancer.release_server(server_id=SERVERS[arg % len(SERVERS)])
    if kind == "add":
        return balancer.add_servers({SERVERS[arg % len(SERVERS)]: f"handle-{arg % len(SERVERS)}"})
    if kind == "remove":
        return balancer.remove_servers([SERVERS[arg % len(SERVERS)]])
    if kind == "clear":
        return balancer.clear_sticky_cache()
    return balancer.get_status()


OPS = st.lists(st.tuples(st.sampled_from(["acquire"] * 4 + ["release"] * 3 + ["add", "remove", "clear", "status"]),
                         st.integers(0, 5)), max_size=60)


@pytest.mark.local
@settings(max_examples=300, deadline=None)
@given(initial=st.integers(0, len(SERVERS)), ops=OPS)
@example(initial=1, ops=[("acquire", 0), ("remove", 0), ("acquire", 0)])  # a sticky entry whose server went
def test_routes_as_verls_balancer_with_ties_broken_first(initial, ops):
    """Every operation answers as verl's GlobalRequestLoadBalancer does when its random tie-break
    picks the first candidate (the one deliberate difference), including errors with no server."""
    import verl.workers.rollout.router as verl_router

    servers = {sid: f"handle-{i}" for i, sid in enumerate(SERVERS[:initial])}
    ours, theirs = LightLoadBalancer(servers, {"router_class": "x"}), verl_router.GlobalRequestLoadBalancer(servers)
    with patch.object(verl_router.random, "choice", lambda candidates: candidates[0]):
        for op in ops:
            outcomes = []
            for balancer in (ours, theirs):
                try:
                    outcomes.append(("ok", _apply(balancer, op)))
                except RuntimeError as exc:
                    outcomes.append(("error", str(exc)))
            assert outcomes[0] == outcomes[1], op
            assert ours.get_all_servers() == theirs.get_all_servers()
            assert ours.get_total_inflight() == theirs.get_total_inflight()
        assert ours.clear_sticky_cache() == theirs.clear_sticky_cache()  # the sticky entries left, too


@pytest.mark.quick
def test_the_sticky_cache_is_bounded_by_the_yaml():
    balancer = LightLoadBalancer({"s0": "h0", "s1": "h1"}, {"max_cache_size": 2})
    for rid in ("a", "b", "c"):
        balancer.acquire_server(rid)
    assert balancer.clear_sticky_cache()["cleared_entries"] == 2


HEAVY = {"verl", "torch", "tensordict", "transformers"}


@pytest.mark.local
@pytest.mark.parametrize("module", ["verl_async_rm_rig.cpu_backend.router", "verl_async_rm_rig.cpu_backend.server_actor",
                                    "verl_async_rm_rig.cpu_backend.engine_link"])
def test_the_modules_a_router_process_loads_import_nothing_heavy(module):
    """The router's process imports the router's module, and the server actor's module (Ray loads the
    class of every actor handle a process receives: the servers verl passes to the router); the
    server actor's process, relaying to the engine in the trainer worker, the link's."""
    code = f"import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(HEAVY | {'ray'})})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.local
def test_the_server_actor_forwards_every_public_method_of_the_server():
    from verl_async_rm_rig.cpu_backend.server import HFCPUServer
    from verl_async_rm_rig.cpu_backend.server_actor import METHODS, HFCPUServerActor

    public = {name for name, member in vars(HFCPUServer).items() if callable(member) and not name.startswith("_")}
    assert public == set(METHODS)
    assert all(inspect.iscoroutinefunction(getattr(HFCPUServer, name)) for name in METHODS)  # forwarded with await
    assert all(inspect.iscoroutinefunction(getattr(HFCPUServerActor, name)) for name in METHODS)


@pytest.mark.quick
def test_every_cpu_run_points_verl_at_it(tmp_path):
    overrides = build_overrides(CPURunConfig(out_dir=str(tmp_path), model_dir="m", train_file="t", val_file="v"))
    assert f"actor_rollout_ref.rollout.router_config_path={config_path()}" in overrides


@pytest.mark.ray
def test_verls_router_factory_builds_it_from_the_packaged_yaml(ray_session):
    """verl's own factory (the path a trainer takes) reads the shipped YAML and routes through it."""
    import ray
    from verl.workers.rollout.router import get_router_handle

    handle = get_router_handle({"s0": "h0"}, router_config_path=config_path())
    assert ray.get(handle.acquire_server.remote(request_id="r1")) == ("s0", "h0")
    assert ray.get(handle.__ray_call__.remote(lambda self: type(self).__qualname__)) == "LightLoadBalancer"
    assert ray.get(handle.get_total_inflight.remote()) == 1
    ray.kill(handle)


@pytest.mark.ray
def test_a_router_given_a_real_hf_cpu_server_imports_neither_torch_nor_verl(ray_session, tmp_path):
    """Ray imports the class module of each actor handle a process receives. With the server behind
    HFCPUServerActor, the router's process, handed a real server's handle, still loads nothing heavy,
    and the handle it gives back generates. (A runtime env of their own: fresh worker processes.)"""
    import ray
    from omegaconf import OmegaConf

    from verl_async_rm_rig.cpu_backend.server import ServerSettings
    from verl_async_rm_rig.cpu_backend.server_actor import HFCPUServerActor
    from verl_async_rm_rig.cpu_backend.tiny_model import build_tiny_model

    config = OmegaConf.create({"seed": 7, "max_model_len": None, "prompt_length": 32, "response_length": 4,
                               "max_num_seqs": 8, "ignore_eos": True, "free_cache_engine": True})
    settings = ServerSettings.read(config, OmegaConf.create({"path": build_tiny_model(str(tmp_path / "model"))}))
    fresh = {"env_vars": {"VERL_ASYNC_RM_TEST_FRESH_WORKER": "router-imports"}}
    server = ray.remote(HFCPUServerActor).options(num_cpus=0, max_concurrency=4, runtime_env=fresh).remote(settings)
    router = ray.remote(LightLoadBalancer).options(num_cpus=0, runtime_env=fresh).remote({"s0": server}, {})
    try:
        server_id, handle = ray.get(router.acquire_server.remote(request_id="r1"))
        out = ray.get(handle.generate.remote("r1", [1, 87, 85], {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                                                   "logprobs": True, "max_tokens": 4}))
        assert server_id == "s0" and 2 <= len(out.token_ids) <= 4
        loaded = ray.get(router.__ray_call__.remote(lambda self: sorted({m.split(".")[0] for m in sys.modules} & HEAVY)))
        assert loaded == []
        # the server's own process: torch and transformers, never verl (cpu_backend/server.py) ...
        server_loaded = ray.get(server.__ray_call__.remote(lambda self: sorted({m.split(".")[0] for m in sys.modules} & HEAVY)))
        assert server_loaded == ["torch", "transformers"]  # (the probe sees what is loaded)
        # ... yet verl's agent loop, receiving its answer, gets verl's TokenOutput
        from verl.workers.rollout.replica import TokenOutput

        assert type(out) is TokenOutput and out.extra_fields["global_steps"] is None and out.stop_reason == "completed"
    finally:
        ray.kill(router)
        ray.kill(server)


@pytest.mark.ray
def test_a_relay_to_an_engine_hosted_elsewhere_generates_and_imports_neither_torch_nor_verl(ray_session, tmp_path):
    """The policy's replicas: the engine lives in verl's trainer worker (here: this test's process,
    the same Ray job, at the address both ends derive), and the replica's actor relays to it. The
    actor's process loads nothing heavy; verl's agent loop still gets verl's TokenOutput; the
    engine's errors reach the caller; weights and sleep go through the host in process."""
    import ray
    import torch
    from omegaconf import OmegaConf

    from verl_async_rm_rig.cpu_backend.engine_link import EngineHost, engine_address
    from verl_async_rm_rig.cpu_backend.server import HFCPUServer, ServerSettings
    from verl_async_rm_rig.cpu_backend.server_actor import HFCPUServerActor
    from verl_async_rm_rig.cpu_backend.tiny_model import build_tiny_model

    config = OmegaConf.create({"seed": 7, "max_model_len": None, "prompt_length": 32, "response_length": 4,
                               "max_num_seqs": 8, "ignore_eos": True, "free_cache_engine": True})
    settings = ServerSettings.read(config, OmegaConf.create({"path": build_tiny_model(str(tmp_path / "model"))}))
    replica = 7  # no other test of this job hosts one
    threads = torch.get_num_threads()
    host = EngineHost(lambda: HFCPUServer(settings, replica, num_threads=None), engine_address(replica))
    assert torch.get_num_threads() == threads  # hosted: the trainer worker's threads stand
    fresh = {"env_vars": {"VERL_ASYNC_RM_TEST_FRESH_WORKER": "relay-imports"}}
    relay = ray.remote(HFCPUServerActor).options(num_cpus=0, max_concurrency=16, runtime_env=fresh).remote(
        engine_address=engine_address(replica))  # as HFCPUReplica starts it: no settings to unpickle
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 4}
    try:
        outs = ray.get([relay.generate.remote(f"r{i}", [1, 87, 85 + i], sampling) for i in range(6)])
        from verl.workers.rollout.replica import TokenOutput

        assert all(type(o) is TokenOutput and 2 <= len(o.token_ids) <= 4 and len(o.log_probs) == len(o.token_ids)
                   for o in outs)
        loaded = ray.get(relay.__ray_call__.remote(lambda self: sorted({m.split(".")[0] for m in sys.modules} & HEAVY)))
        assert loaded == []
        with pytest.raises(NotImplementedError, match="text-only"):
            ray.get(relay.generate.remote("img", [1, 2], sampling, image_data=["x"]))
        # the adapter's path: in process, on the engine's own loop; the relay sees the result
        state = host.engine.model.state_dict()
        assert asyncio.run(host.call("update_weights", state, 3)) == len(state)
        asyncio.run(host.call("sleep"))
        assert ray.get(relay.get_state.remote()) == {"global_steps": 3, "weight_updates": 1, "awake": [], "paused": False,
                                                         "aborted_requests": 0, "resumed_requests": 0}
        with pytest.raises(RuntimeError, match="while asleep"):
            ray.get(relay.generate.remote("late", [1, 2], sampling))
    finally:
        ray.kill(relay)
        host.close()


@pytest.mark.local
def test_the_adapter_hosts_the_engine_only_in_verls_trainer_worker(monkeypatch):
    """verl builds the rollout adapter in its trainer worker with a device mesh (hybrid, "rollout
    engine and training engine fused in same process": the engine lives there) and in its
    CheckpointEngineWorker without one (colocated or standalone replicas, e.g. a reward model's: the
    engine runs in the replica's actor, which the adapter reaches by name, as before)."""
    import types

    from verl_async_rm_rig.cpu_backend import rollout

    hosted, named = [], []

    class RecordingHost:
        def __init__(self, build, address):
            hosted.append(address)

        async def call(self, method, *args, **kwargs):
            hosted.append(method)

    class RecordingHandle:
        def __getattr__(self, method):
            async def answer():
                return None

            return types.SimpleNamespace(remote=lambda *args, **kwargs: (named.append(method), answer())[1])

    monkeypatch.setattr(rollout, "EngineHost", RecordingHost)
    monkeypatch.setattr(rollout, "engine_address", lambda replica: f"engine-{replica}")
    monkeypatch.setattr(rollout.ray, "get_actor", lambda name: (named.append(name), RecordingHandle())[1])
    monkeypatch.setenv("RANK", "0")
    config = types.SimpleNamespace(tensor_model_parallel_size=1, data_parallel_size=1, pipeline_model_parallel_size=1,
                                   free_cache_engine=True, seed=0, prompt_length=8, response_length=4,
                                   max_model_len=None, max_num_seqs=4, ignore_eos=False)
    model = types.SimpleNamespace(local_path="/m", path="/m")

    in_trainer_worker = rollout.HFServerAdapter(config, model, device_mesh=object())
    asyncio.run(in_trainer_worker.resume(["weights"]))
    assert hosted == ["engine-0", "wake_up"] and named == []

    hosted.clear()
    in_checkpoint_worker = rollout.HFServerAdapter(config, model, device_mesh=None, replica_rank=1)
    asyncio.run(in_checkpoint_worker.release())
    assert in_checkpoint_worker.engine is None and hosted == [] and named == ["hf_cpu_server_1_0", "sleep"]
