"""The ``hf_cpu`` rollout server: a transformers causal LM sampling on CPU, with log-probs.

Imports torch and transformers, never verl. A replica's engine normally lives in verl's trainer
worker, started by the rollout adapter there (``rollout.HFServerAdapter``, ``engine_link``), where
verl is loaded anyway; a colocated or standalone replica (a reward or teacher model's) runs it in its
Ray actor's process (``server_actor.HFCPUServerActor``), which would otherwise spend ~1.2 CPU-s (~1.8
with five runs starting together) importing verl for two types. So it takes its settings as a plain
:class:`ServerSettings` (read from verl's rollout and model configs by the replica), and answers with
:class:`GeneratedTokens`, which unpickles as verl's ``TokenOutput`` in the process that receives it
(verl's agent loop, where verl is imported anyway).

* Concurrent ``generate`` calls are queued and served in batches; each row's answer is delivered the
  moment its last token is sampled.
* Determinism: with verl's ``rollout.full_determinism`` the agent loops name requests ``det-{row}``;
  such a request is sampled alone, from a generator seeded by (seed, weight version, request id, its
  occurrence), so a run reproduces whatever order requests arrive in.
* Paired draws (``PAIRED_DRAWS_ENV``, for benchmarks): every sampled request gets a generator seeded
  by its content (seed, prompt, sampling parameters, how often this server sampled that prompt), not
  by the weight version, and is batched with the others as usual (each row samples from its own
  generator). Two runs of different strategies then draw the same random numbers for the same
  prompt, even when one generates it a step ahead with older weights, so their learning curves
  differ by what the strategy changed, not by sampling luck (common random numbers). Not bit-exact
  across batch compositions (a padded batch's numerics differ in the last bits).
* Lengths and finishing times vary per request, as real decoding's do: each request stops after a
  length drawn in [``MIN_LENGTH_FRACTION`` x its max tokens, its max tokens] (deterministic: from the
  request's own seed, or the server's seeded stream). ``DECODE_S_ENV`` adds a simulated per-token
  decode time (a GPU's), so that finishing times spread as they do on real hardware.
* Sleep and wake free nothing on CPU but are kept as state, as a GPU engine's memory would be:
  generating while asleep is an error, and every transition is logged (``REPLICA_LOG_ENV``), so tests
  can see whether training ran beside awake replicas.
* Partial rollouts, as verl's vLLM server does them for its async trainers (``colocate_async``):
  ``abort_all_requests`` closes the submission gate and stops every unfinished request at its next
  token, answering it with the tokens (and log-probs) sampled so far and ``stop_reason="aborted"``;
  requests arriving behind the closed gate wait until ``resume_generation`` (or, with
  ``reject_request``, are answered aborted at once). verl's ``FullyAsyncLLMServerClient`` then
  re-submits prompt + partial tokens with the rest of the budget; the server recognises such a
  continuation and keeps the aborted request's drawn length and its own generator, so the response
  is the length it would have been, and a deterministic request resumed on unchanged weights samples
  the very tokens it would have without the abort. Aborts and resumes are logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from typing import Any, Optional

import torch

from .names import DECODE_S_ENV, PAIRED_DRAWS_ENV, REPLICA_LOG_ENV, WEIGHT_SYNC_S_ENV
from .token_output import GeneratedTokens

logger = logging.getLogger(__name__)
# A request stops after a drawn length in [this fraction of its max tokens, its max tokens]: real
# responses differ in length; half keeps the toy task's responses long enough to score.
MIN_LENGTH_FRACTION = 0.5


# A row's finish when abort_all_requests stopped it (sample_batch); answered as verl's "aborted".
ABORTED = "abort"


def drawn_length(max_tokens: int, rng: random.Random) -> int:
    low = max(1, math.ceil(max_tokens * MIN_LENGTH_FRACTION))
    return rng.randint(low, max(low, max_tokens))


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """What the server reads of verl's rollout and model configs (plain values: unpickling verl's
    config classes in the server's process would import verl)."""

    model_path: str
    seed: int
    prompt_length: int
    response_length: int
    max_model_len: Optional[int]  # None: prompt_length + response_length
    max_num_seqs: int
    ignore_eos: bool
    free_cache_engine: bool

    @classmethod
    def read(cls, config, model_config) -> "ServerSettings":
        """From verl's ``RolloutConfig`` and ``HFModelConfig`` (or the DictConfigs they come from)."""
        # HFModelConfig (dataclass) carries local_path; a raw DictConfig only path.
        path = getattr(model_config, "local_path", None) or model_config.path
        return cls(model_path=os.path.expanduser(path), seed=int(config.seed), prompt_length=int(config.prompt_length),
                   response_length=int(config.response_length),
                   max_model_len=int(config.max_model_len) if config.max_model_len else None,
                   max_num_seqs=int(config.max_num_seqs), ignore_eos=bool(config.ignore_eos),
                   free_cache_engine=bool(config.free_cache_engine))


# ------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k / nucleus top-p (vLLM semantics: -1 / 1.0 disable them)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        remove = cum - torch.softmax(sorted_logits, dim=-1) > top_p  # keep the token crossing top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)
    return logits


@torch.no_grad()
def sample_batch(
    model,
    prompts: list[list[int]],
    max_tokens: list[int],
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    eos_ids: set[int],
    ignore_eos: bool,
    generator: "torch.Generator | list[torch.Generator]",
    pad_id: int,
    on_done=None,
    decode_s: float = 0.0,
    abort: Optional[threading.Event] = None,
) -> list[tuple[list[int], list[float], str]]:
    """Batched autoregressive sampling (left-padded, KV cache); per prompt (ids, log_probs, finish).
    ``on_done(i, result)`` is called as soon as row i finishes (the others keep decoding);
    ``decode_s`` seconds are slept per decoding step (a simulated accelerator's token time).
    ``generator``: one for the batch, or one per row (each row's t-th token is then its own
    generator's t-th draw, whatever else is in the batch). ``abort`` set: the rows not finished yet
    stop before their next token, finishing ``ABORTED`` with what they have (verl's partial rollout).

    Log-probs are of the processed distribution (temperature, top-k/p), like vLLM's
    ``processed_logprobs``; the trainer recomputes ``log_softmax(logits / temperature)``, so with
    top_k=-1/top_p=1 the two agree up to numerics, which is what the weight-sync check measures.
    """
    bsz, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((bsz, width), pad_id, dtype=torch.long)
    attn = torch.zeros((bsz, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attn[i, width - len(p) :] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    next_pos = position_ids[:, -1:] + 1
    results: list[tuple[list[int], list[float], str]] = [([], [], "length") for _ in prompts]
    done = [False] * bsz
    past = None
    for _ in range(max(max_tokens)):
        if abort is not None and abort.is_set():
            for i in range(bsz):
                if not done[i]:
                    results[i], done[i] = (results[i][0], results[i][1], ABORTED), True
            break
        out = model(
            input_ids=input_ids, attention_mask=attn, position_ids=position_ids, past_key_values=past, use_cache=True
        )
        past = out.past_key_values
        logits = out.logits[:, -1].float()
        if temperature and temperature > 0:
            logits = _filter_logits(logits / temperature, top_k, top_p)
            logp = torch.log_softmax(logits, dim=-1)
            probs = logp.exp()
            if isinstance(generator, list):
                tokens = torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generator)])
            else:
                tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        else:  # greedy (validation)
            logp = torch.log_softmax(logits, dim=-1)
            tokens = torch.argmax(logits, dim=-1)
        chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
        if decode_s > 0:
            time.sleep(decode_s)
        for i in range(bsz):
            if done[i]:
                continue
            ids, lps, _ = results[i]
            ids.append(int(tokens[i]))
            lps.append(float(chosen[i]))
            if not ignore_eos and int(tokens[i]) in eos_ids:
                results[i], done[i] = (ids, lps, "stop"), True
            elif len(ids) >= max_tokens[i]:
                done[i] = True
            if done[i] and on_done is not None:
                on_done(i, results[i])
        if all(done):
            break
        input_ids = tokens[:, None]  # finished rows keep decoding garbage that is never read
        attn = torch.cat([attn, torch.ones((bsz, 1), dtype=torch.long)], dim=-1)
        position_ids, next_pos = next_pos, next_pos + 1
    return results


def _answer(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


@dataclasses.dataclass
class _Request:
    """A queued or running ``generate`` call."""

    batch_key: tuple  # requests of one key share a batch
    sampling_key: tuple  # (temperature, top_p, top_k)
    request_id: str
    prompt: list[int]
    length: int  # tokens to sample (its drawn length, less what an aborted run of it sampled)
    answer: asyncio.Future
    generator: Optional[torch.Generator]  # its own (deterministic, paired draws) or None: the server's
    alone: bool  # sampled in a batch of its own


@dataclasses.dataclass
class _Resumable:
    """What an aborted request leaves for its continuation (verl re-submits prompt + partial tokens)."""

    remaining: int  # of its drawn length
    generator: Optional[torch.Generator]
    alone: bool


# ------------------------------------------------------------------------------------------------
# the engine (in the trainer worker, or in the replica's actor)
# ------------------------------------------------------------------------------------------------


class HFCPUServer:
    """One rollout server: a transformers causal LM in fp32 on CPU.

    Concurrent ``generate`` calls are queued and served in batches (requests arriving while a batch
    runs form the next one), grouped by sampling parameters. The lock makes a weight update wait
    for the running batch, so each response comes from a single weight version.
    """

    BATCH_WINDOW_S = 0.005  # let the agent loop's concurrent requests gather before a batch starts

    def __init__(self, settings: ServerSettings, replica_rank: int = 0, num_threads: Optional[int] = 1) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        # A Ray actor of its own on a small box: keep torch from spawning a thread per core. None (hosted
        # in the trainer worker): the worker's setting stands, training shares it.
        if num_threads is not None:
            torch.set_num_threads(max(1, num_threads))
        self.settings = settings
        self.replica_rank = replica_rank
        path = settings.model_path
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        self.model.eval()
        eos = None
        try:
            eos = GenerationConfig.from_pretrained(path).eos_token_id
        except OSError:
            pass
        eos = eos if eos is not None else self.model.config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))
        self.generator = torch.Generator().manual_seed(settings.seed + replica_rank)
        self.global_steps: Optional[int] = None
        self.weight_updates = 0
        self._lock = asyncio.Lock()
        self._warned_keys: set[str] = set()
        self._queue: list[_Request] = []
        self._drainer: Optional[asyncio.Task] = None
        # The running batch's abort flag (read by its sampling thread), set by abort_all_requests.
        self._batch_abort: Optional[threading.Event] = None
        # The submission gate (verl's vLLM server's): closed by abort_all_requests, opened by
        # resume_generation; requests arriving while it is closed wait, or are answered aborted.
        self._gate_open = asyncio.Event()
        self._gate_open.set()
        self._rejecting = False
        self._parked = 0
        # (sampling key, prompt + partial tokens) -> what aborted requests with that continuation left
        self._resumable: dict[tuple, list[_Resumable]] = {}
        self._aborted_rows: list[tuple[str, int]] = []  # (request id, tokens kept) since the last abort call
        self.aborted_requests = 0
        self.resumed_requests = 0
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self.seed = settings.seed
        self.awake = {"weights", "kv_cache"}  # a fresh engine holds both
        self.sleeps_since_update = 0
        self._occurrences: dict[tuple, int] = {}
        self._length_rng = random.Random(self.seed * 1000 + replica_rank)  # lengths of non-deterministic requests
        self.paired_draws = os.environ.get(PAIRED_DRAWS_ENV) == "1"
        self._prompt_draws: dict[tuple, int] = {}  # paired draws: (prompt, sampling key) -> times sampled
        self.decode_s = float(os.environ.get(DECODE_S_ENV) or 0.0)
        self.weight_sync_s = float(os.environ.get(WEIGHT_SYNC_S_ENV) or 0.0)
        self._log_path = os.environ.get(REPLICA_LOG_ENV) or None

    def _log(self, event: str, **fields) -> None:
        if self._log_path is None:
            return
        entry = {"event": event, "time": time.time(), "replica": self.replica_rank, "global_steps": self.global_steps,
                 "awake": sorted(self.awake), **fields}
        with open(self._log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def _request_generator(
        self, request_id: str, key: tuple, prompt_ids: list[int]
    ) -> tuple[Optional[torch.Generator], random.Random, bool]:
        """(generator, length stream, sampled alone) of a request.

        verl's deterministic request ids (``det-{row}``): a generator of their own, seeded by the
        weight version, the id and how often this id was sampled with these parameters at this
        version (off-policy generates twice per version; multi-turn loops reuse the id per turn),
        and the stream its length is drawn from (another part of the same digest); sampled alone.
        Paired draws: seeded by the prompt and how often it was sampled (its GRPO group's members
        are exchangeable, so their arrival order does not matter); batched. Other requests: the
        server's generator and length stream."""
        if str(request_id).startswith("det-"):
            slot: tuple = (self.global_steps, str(request_id), key)
            counts, alone = self._occurrences, True
        elif self.paired_draws:
            slot, counts, alone = (tuple(prompt_ids), key), self._prompt_draws, False
        else:
            return None, self._length_rng, False
        occurrence = counts.get(slot, 0)
        counts[slot] = occurrence + 1
        digest = hashlib.sha256(f"{self.seed}|{slot}|{occurrence}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") & ((1 << 63) - 1))
        return generator, random.Random(int.from_bytes(digest[8:16], "big")), alone

    # -- generation ---------------------------------------------------------------------------------
    def _max_tokens(self, prompt_len: int, sampling_params: dict) -> int:
        max_model_len = self.settings.max_model_len or (self.settings.prompt_length + self.settings.response_length)
        room = max_model_len - prompt_len
        if room < 1:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room within max_model_len={max_model_len}")
        if "max_tokens" in sampling_params:
            want = sampling_params["max_tokens"]
        elif "max_new_tokens" in sampling_params:
            want = sampling_params["max_new_tokens"]
        else:
            budget = self.settings.prompt_length + self.settings.response_length - prompt_len
            want = min(self.settings.response_length, budget)
        return max(1, min(int(want), room))

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs: Any,
    ) -> GeneratedTokens:
        if image_data or video_data or kwargs.get("audio_data"):
            raise NotImplementedError("hf_cpu rollout is text-only")
        params = dict(sampling_params)
        if float(params.get("repetition_penalty", 1.0)) != 1.0:
            raise NotImplementedError("hf_cpu rollout does not implement repetition_penalty != 1.0")
        known = {"temperature", "top_p", "top_k", "logprobs", "max_tokens", "max_new_tokens", "repetition_penalty"}
        for key in set(params) - known - self._warned_keys:
            self._warned_keys.add(key)
            logger.warning("hf_cpu rollout ignores sampling param %r", key)
        # The gate before the sleep check: verl's async trainers put paused replicas to sleep, and
        # a request parked behind the gate runs only after the wake-up and the resume.
        while not self._gate_open.is_set():
            if self._rejecting:
                self._log("rejected", request_id=str(request_id))
                return self._aborted_answer([], [], self.global_steps, params)
            self._parked += 1
            try:
                await self._gate_open.wait()
            finally:
                self._parked -= 1
        if self.awake != {"weights", "kv_cache"}:
            self._log("generate_while_asleep", request_id=str(request_id))
            raise RuntimeError(
                f"hf_cpu replica {self.replica_rank} got a generate call while asleep (awake: {sorted(self.awake)}); "
                "a GPU engine would have freed its weights or KV cache"
            )
        key = (float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0)), int(params.get("top_k", -1)))
        prompt = [int(t) for t in prompt_ids]
        budget = self._max_tokens(len(prompt), params)
        resumed = self._take_resumable(key, prompt)
        if resumed is not None:
            own, alone = resumed.generator, resumed.alone
            length = max(1, min(resumed.remaining, budget))
            self.resumed_requests += 1
            self._log("resumed", request_id=str(request_id), prompt_tokens=len(prompt), remaining=length)
        else:
            own, lengths, alone = self._request_generator(request_id, key, prompt)
            length = drawn_length(budget, lengths)
        # A deterministic request is batched alone: its own generator, and no padding from others.
        batch_key = (key, request_id) if alone else key
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(batch_key, key, str(request_id), prompt, length, future, own, alone))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        ids, lps, finish, version = await future
        if finish == ABORTED:
            return self._aborted_answer(ids, lps, version, params)
        return GeneratedTokens(
            token_ids=ids,
            log_probs=lps if params.get("logprobs") else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": version, "finish_reason": finish},
        )

    @staticmethod
    def _aborted_answer(ids: list[int], lps: list[float], version, params: dict) -> GeneratedTokens:
        # verl's vLLM server: the tokens so far, stop_reason "aborted" (FullyAsyncLLMServerClient re-submits)
        return GeneratedTokens(token_ids=list(ids), log_probs=list(lps) if params.get("logprobs") else None,
                               stop_reason="aborted", num_preempted=0,
                               extra_fields={"global_steps": version, "finish_reason": ABORTED})

    def _take_resumable(self, key: tuple, prompt: list[int]) -> Optional[_Resumable]:
        waiting = self._resumable.get((key, tuple(prompt)))
        if not waiting:
            return None
        resumed = waiting.pop(0)
        if not waiting:
            del self._resumable[(key, tuple(prompt))]
        return resumed

    def _leave_resumable(self, request: _Request, ids: list[int]) -> None:
        """An aborted request's continuation: verl re-submits prompt + ``ids`` (the GRPO group's
        members of one prompt are exchangeable, so which of them takes an entry does not matter)."""
        self.aborted_requests += 1
        self._aborted_rows.append((request.request_id, len(ids)))
        entry = _Resumable(remaining=request.length - len(ids), generator=request.generator, alone=request.alone)
        self._resumable.setdefault((request.sampling_key, tuple(request.prompt + ids)), []).append(entry)

    async def _drain(self) -> None:
        while self._queue:
            await asyncio.sleep(self.BATCH_WINDOW_S)
            if not self._queue:  # abort_all_requests answered them meanwhile
                break
            first = self._queue[0]
            limit = 1 if first.alone else max(1, int(self.settings.max_num_seqs))
            batch = [item for item in self._queue if item.batch_key == first.batch_key][:limit]
            self._queue = [item for item in self._queue if not any(item is b for b in batch)]
            # Set before the batch even starts, so an abort while it waits for the lock stops it too.
            abort = self._batch_abort = threading.Event()
            temperature, top_p, top_k = first.sampling_key
            if first.alone:
                generator = first.generator
            else:  # paired draws: every row samples from its own generator
                generator = [b.generator for b in batch] if self.paired_draws else self.generator
            loop = asyncio.get_running_loop()
            try:
                async with self._lock:
                    version = self.global_steps

                    def deliver(i, result, batch=batch, version=version):
                        # from the sampling thread: each row answers the moment it is done
                        ids, lps, finish = result
                        if finish != ABORTED:
                            loop.call_soon_threadsafe(_answer, batch[i].answer, (list(ids), list(lps), finish, version))

                    results = await asyncio.to_thread(
                        sample_batch,
                        self.model,
                        [b.prompt for b in batch],
                        [b.length for b in batch],
                        temperature=temperature,
                        top_p=top_p,
                        top_k=top_k,
                        eos_ids=self.eos_ids,
                        ignore_eos=bool(self.settings.ignore_eos),
                        generator=generator,
                        pad_id=self.pad_id,
                        on_done=deliver,
                        decode_s=self.decode_s,
                        abort=abort,
                    )
                    # Under the lock: once it is free, every row of the batch is answered (abort_all_requests
                    # and sleep wait on it).
                    for b, (ids, lps, finish) in zip(batch, results, strict=True):
                        if finish == ABORTED and not b.answer.done():
                            self._leave_resumable(b, list(ids))
                        _answer(b.answer, (list(ids), list(lps), finish, version))  # answered rows keep theirs
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting caller
                for b in batch:
                    if not b.answer.done():
                        b.answer.set_exception(exc)
                continue
            finally:
                self._batch_abort = None

    # -- weights -------------------------------------------------------------------------------------
    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: Optional[int] = None) -> int:
        async with self._lock:
            expected = set(self.model.state_dict())
            missing = expected - set(state_dict)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            if missing - tied:
                raise KeyError(f"weight update misses {sorted(missing - tied)[:5]}")
            unexpected = set(state_dict) - expected
            if unexpected:
                raise KeyError(f"weight update has unknown tensors {sorted(unexpected)[:5]}")
            self.model.load_state_dict(state_dict, strict=False)
            if self.weight_sync_s:
                await asyncio.sleep(self.weight_sync_s)  # a simulated GPU weight sync (names.WEIGHT_SYNC_S_ENV)
            if global_steps is not None:
                self.global_steps = global_steps
            self.weight_updates += 1
            # requested: the trainer's global step (None: a re-sync, e.g. v1 validation's wake-up)
            self._log("update_weights", sleeps_since_update=self.sleeps_since_update, requested=global_steps)
            self.sleeps_since_update = 0
            return len(state_dict)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps
        self._log("update_weights", sleeps_since_update=self.sleeps_since_update, requested=global_steps, synced=False)
        self.sleeps_since_update = 0

    async def get_state(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "weight_updates": self.weight_updates, "awake": sorted(self.awake),
                "paused": not self._gate_open.is_set(), "aborted_requests": self.aborted_requests,
                "resumed_requests": self.resumed_requests}

    # -- control plane: sleep/wake as state (nothing to free on CPU) --------------------------------
    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        woken = set(tags or ("weights", "kv_cache"))
        self.awake |= woken
        self._log("wake_up", tags=sorted(woken))

    async def sleep(self) -> None:
        if not self.settings.free_cache_engine:  # as verl's vLLM server: nothing is freed, nothing sleeps
            return
        await self.wait_for_requests_to_drain()
        self.awake.clear()
        self.sleeps_since_update += 1
        self._log("sleep")

    async def clear_kv_cache(self) -> None:
        return None  # the KV cache lives per request

    async def release_kv_cache(self) -> None:
        self.awake.discard("kv_cache")

    async def resume_kv_cache(self) -> None:
        self.awake.add("kv_cache")

    async def wait_for_requests_to_drain(self) -> None:
        while self._queue or self._lock.locked():
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """verl's partial rollout (its vLLM server's ``pause_generation``): close the gate, answer every
        unfinished request with its tokens so far and ``stop_reason="aborted"``, and return once no
        batch runs (the weights may change then). The gate stays closed until :meth:`resume_generation`;
        ``reject_request``: requests arriving meanwhile are answered aborted instead of waiting."""
        self._gate_open.clear()
        self._rejecting = reject_request
        queued, self._queue = self._queue, []
        for request in queued:  # never started: its continuation is the request itself
            if not request.answer.done():
                self._leave_resumable(request, [])
                _answer(request.answer, ([], [], ABORTED, self.global_steps))
        if self._batch_abort is not None:
            self._batch_abort.set()  # the sampling thread stops before its next token
        await self.wait_for_requests_to_drain()
        aborted, self._aborted_rows = self._aborted_rows, []
        self._log("abort", aborted=len(aborted), partial_tokens=[n for _, n in aborted], reject_request=reject_request)
        return {"aborted_count": len(aborted), "request_ids": [request_id for request_id, _ in aborted]}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        # No verl trainer calls it (its replicas abort all at once); a single request is not stopped.
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._gate_open.set()
        self._log("resume_generation", parked=self._parked)

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
