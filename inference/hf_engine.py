"""The transformers backend: mixed-adapter batched generation on the learners' multi-LoRA layer.

The frozen base is loaded once and wrapped by :class:`learners.multi_lora.MultiLoRAModel`, the same
layer the learners train with (one implementation of the LoRA maths). Each loaded adapter owns one
slot; a row's slot is its adapter (``NO_ADAPTER`` for the base), fixed for the whole batch.

Decoding (nanoGPT-style loop, one batched forward per step over every row of every adapter):

1. rows (request x sample) are sorted by slot, so each adapter's rows are contiguous and the
   grouped LoRA kernel works on views;
2. prompts are left-padded; ``position_ids = cumsum(mask) - 1`` so padding does not shift positions;
3. prefill fills a ``DynamicCache``; each step feeds one token per row and appends to it;
4. rows that finish (EOS, stop string, token budget) leave the batch and the cache
   (``batch_select_indices``), so the cost follows the rows still running.

Adapters are read by ``learners.peft_io.load_adapter`` into their slot. Unlike vLLM (rank <=
``max_lora_rank``, any subset of modules) this backend needs every adapter to have rank exactly
``max_lora_rank`` and LoRA factors on every target module, as the system's adapters do; a different
alpha or rsLoRA setting is converted exactly by rescaling B. A hot swap overwrites the slot's
factors in place.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.base import EngineBase, LoadedAdapter, PreparedRequest, cut_at_stop, sample_seed
from inference.requests import AdapterLoadError, Generation
from inference.sampling import sample_tokens
from learners.multi_lora import NO_ADAPTER, TARGET_MODULES, LoRASpec, MultiLoRAModel, Strategy
from learners.peft_io import load_adapter as load_peft_adapter

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Row:
    """One sample being generated: a request's prompt for one of its ``n`` samples."""

    request: int
    sample: int
    prepared: PreparedRequest
    slot: int
    generator: torch.Generator
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class HFEngine(EngineBase):
    """Transformers + :class:`MultiLoRAModel`; the default where vLLM is absent."""

    backend = "hf"

    def __init__(
        self,
        model_path: str | Path,
        max_adapters: int,
        max_lora_rank: int,
        dtype: str = "float32",
        max_model_len: int | None = None,
        target_modules: tuple[str, ...] = TARGET_MODULES,
        strategy: Strategy = "grouped",
        max_batch_rows: int = 256,
        seed: int = 0,
        device: str | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).to(self.device).eval()
        context = max_model_len or getattr(base.config, "max_position_embeddings", None) or 2048
        super().__init__(tokenizer, context, max_adapters, max_lora_rank)
        # Every adapter must have rank max_lora_rank and these target modules (the system's adapters share
        # lora.rank and lora.target_modules); peft_io rescales B exactly for another alpha or rsLoRA.
        spec = LoRASpec(rank=max_lora_rank, alpha=float(max_lora_rank), num_slots=max_adapters,
                        target_modules=tuple(target_modules))
        self.model = MultiLoRAModel(base, spec, strategy=strategy)
        # transformers renames forward's past_key_values to cache (5.2x warns; 5.40 drops the old name)
        self._cache_kwarg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.max_batch_rows = max_batch_rows
        self._free_slots = list(range(max_adapters))
        self._slot_of: dict[str, int] = {}
        self._seeds = torch.Generator().manual_seed(seed)
        eos = {tokenizer.eos_token_id}
        config_eos = getattr(base.generation_config, "eos_token_id", None)
        eos |= set(config_eos) if isinstance(config_eos, list) else {config_eos}
        self.eos_ids = frozenset(i for i in eos if i is not None)
        self.pad_id = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)

    # -- adapters -----------------------------------------------------------------------------

    def _install(self, entry: LoadedAdapter, previous: LoadedAdapter | None) -> None:
        slot = self._slot_of[entry.name] if previous else self._free_slots[0]
        try:
            load_peft_adapter(self.model, slot, entry.path)
        except (KeyError, ValueError, FileNotFoundError) as err:
            raise AdapterLoadError(f"cannot load adapter {entry.name!r} into the transformers engine: {err}") from err
        if previous is None:
            self._slot_of[entry.name] = self._free_slots.pop(0)

    def _uninstall(self, entry: LoadedAdapter) -> None:
        slot = self._slot_of.pop(entry.name)
        self.model.reset_slot(slot)  # B = 0: an unused slot is an exact no-op
        self._free_slots.append(slot)

    # -- generation ---------------------------------------------------------------------------

    def _generate(self, prepared: list[PreparedRequest]) -> list[list[Generation]]:
        rows: list[_Row] = []
        for i, p in enumerate(prepared):
            slot = self._slot_of[p.adapter.name] if p.adapter else NO_ADAPTER
            for j in range(p.request.n):
                seed = (sample_seed(p.request.seed, j) if p.request.seed is not None
                        else int(torch.randint(2**62, (), generator=self._seeds)))
                rows.append(_Row(i, j, p, slot, torch.Generator().manual_seed(seed)))
        ordered = sorted(rows, key=lambda r: r.slot)
        for start in range(0, len(ordered), self.max_batch_rows):
            self._decode(ordered[start : start + self.max_batch_rows])
        results: list[list[Generation]] = [[] for _ in prepared]
        for row in rows:
            results[row.request].append(self._to_generation(row))
        return results

    @torch.inference_mode()
    def _decode(self, rows: list[_Row]) -> None:
        from transformers import DynamicCache

        lengths = [len(r.prepared.prompt_ids) for r in rows]
        width = max(lengths)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            input_ids[i, width - n :] = torch.tensor(row.prepared.prompt_ids)
            mask[i, width - n :] = 1
        dev = self.device
        input_ids, mask = input_ids.to(dev), mask.to(dev)  # once; the decode loop keeps mask and positions on dev
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        temperature = torch.tensor([r.prepared.request.temperature for r in rows], device=dev)
        top_p = torch.tensor([r.prepared.request.top_p for r in rows], device=dev)
        live = list(range(len(rows)))  # indices into rows of the rows still in the batch
        cache = DynamicCache()
        self.model.set_adapter_index([r.slot for r in rows])
        try:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
            while True:
                batch = [rows[i] for i in live]
                live_index = torch.tensor(live, device=dev)
                tokens, logprobs = sample_tokens(out.logits[:, -1, :], temperature[live_index], top_p[live_index],
                                                 [r.generator for r in batch])
                tokens = tokens.cpu()
                keep = [k for k, (row, tok, lp) in enumerate(zip(batch, tokens.tolist(), logprobs.tolist()))
                        if self._append(row, tok, lp)]
                if not keep:
                    return
                if len(keep) < len(live):
                    index = torch.tensor(keep, device=dev)
                    cache.batch_select_indices(index)
                    mask, positions, tokens = mask[index], positions[index], tokens[index.cpu()]
                    live = [live[k] for k in keep]
                    self.model.set_adapter_index([rows[i].slot for i in live])
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                positions = positions[:, -1:] + 1
                out = self.model(input_ids=tokens[:, None].to(dev), attention_mask=mask, position_ids=positions,
                                 use_cache=True, **{self._cache_kwarg: cache})
        finally:
            self.model.set_adapter_index(None)

    def _append(self, row: _Row, token: int, logprob: float) -> bool:
        """Record a sampled token; return whether the row keeps generating."""
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        stops = row.prepared.request.stop
        if token in self.eos_ids:
            row.finish_reason = "stop"
        elif stops and self._tail_has_stop(row.token_ids, stops):
            row.finish_reason = "stop"
        elif len(row.token_ids) >= row.prepared.max_tokens:
            row.finish_reason = "length"
        return row.finish_reason is None

    def _tail_has_stop(self, token_ids: list[int], stops: list[str]) -> bool:
        # A stop string that just completed ends in the newest token and spans at most 4 bytes per
        # character, hence at most that many byte-level tokens: decode only that tail.
        window = 4 * max(len(s) for s in stops) + 4
        tail = self.tokenizer.decode(token_ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    def _to_generation(self, row: _Row) -> Generation:
        # A trailing U+FFFD is an incomplete UTF-8 sequence cut off by the end of generation; drop it,
        # as vLLM's incremental detokenizer does, so both backends return the same text.
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True).rstrip("\ufffd")
        text, _ = cut_at_stop(text, row.prepared.request.stop)
        adapter = row.prepared.adapter
        return Generation(
            text=text,
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            adapter=adapter.name if adapter else None,
            adapter_version=adapter.version if adapter else None,
            finish_reason=row.finish_reason or "length",
            prompt_token_ids=row.prepared.prompt_ids,
        )
