"""``MarconiUnifiedRadixCache``: SGLang's ``UnifiedRadixCache`` with Marconi's policy.

The tree, locks, pools and the scheduler interface are SGLang's; the subclass swaps in
the Marconi MAMBA and FULL components (``components``: scored eviction, admission) and
keeps what they consult in a ``policy_state.MarconiPolicyState``. Admission and scoring
rules come from ``sglang_marconi.policy``; nothing here re-implements them.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_marconi.sglang_integration.components import (
    MarconiFullComponent,
    MarconiMambaComponent,
)
from sglang_marconi.sglang_integration.options import MarconiSettings
from sglang_marconi.sglang_integration.policy_state import MarconiPolicyState
from sglang_marconi.sglang_integration.stats import MarconiStats, make_exporter

logger = logging.getLogger("sglang_marconi.cache")


class MarconiUnifiedRadixCache(UnifiedRadixCache):
    """``UnifiedRadixCache`` (FULL + MAMBA) whose eviction and admission follow Marconi."""

    def __init__(self, params, *, settings: Optional[MarconiSettings] = None, spec=None):
        from sglang.srt.runtime_context import mamba_checkpoint_grid

        if params.tree_components is None or ComponentType.MAMBA not in params.tree_components:
            raise ValueError("MarconiUnifiedRadixCache needs a hybrid model (FULL + MAMBA "
                             f"components), got {params.tree_components}")
        if spec is None:
            raise ValueError("MarconiUnifiedRadixCache needs the model's HybridModelSpec")
        params = dataclasses.replace(params, component_registry_override={
            **(params.component_registry_override or {}),
            ComponentType.MAMBA: MarconiMambaComponent,
            ComponentType.FULL: MarconiFullComponent,
        })
        # extra_buffer snapshots land on the mamba checkpoint grid; no_buffer (page 1)
        # keeps the exact end of each chunk and sequence.
        grid = (mamba_checkpoint_grid(params.page_size) if params.enable_mamba_extra_buffer
                else params.page_size)
        self.marconi = MarconiPolicyState(
            settings or MarconiSettings(), spec, grid=grid,
            kv_tokens=params.token_to_kv_pool_allocator.size,
            state_slots=params.req_to_token_pool.mamba_pool.size,
            page_size=params.page_size, extra_buffer=params.enable_mamba_extra_buffer)
        super().__init__(params)
        self.marconi.exporter = make_exporter(self)
        if self.marconi.exporter is not None:
            self.marconi.exporter.set_alpha(self.marconi.alpha)
        logger.info("Marconi cache: spec=%s alpha=%s max_states_per_request=%s",
                    spec.name, self.marconi.settings.alpha,
                    self.marconi.settings.max_states_per_request)

    @property
    def marconi_stats(self) -> MarconiStats:
        return self.marconi.stats

    def _finalize_match_result(self, params, result):
        result = super()._finalize_match_result(params, result)
        if params.req is not None:
            self.marconi.on_match(params.req, result)
        return result

    def on_release(self, req, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        self.marconi.on_release(req, finished=checkpointed)

    def _evict(self, params, *args, **kwargs):
        result = super()._evict(params, *args, **kwargs)
        if result.num_tokens_evicted or result.mamba_num_evicted:
            self.marconi.on_eviction()
        return result
