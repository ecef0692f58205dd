"""``MarconiUnifiedRadixCache``: SGLang's ``UnifiedRadixCache`` with the Marconi MAMBA and FULL
components and a ``policy_state.MarconiPolicyState``; the rules come from
``sglang_marconi.policy``, nothing here re-implements them."""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_marconi.policy.clock_log import ClockLog
from sglang_marconi.sglang_integration.components import (MarconiFullComponent,
                                                          MarconiMambaComponent)
from sglang_marconi.sglang_integration import unified
from sglang_marconi.sglang_integration.options import MarconiSettings
from sglang_marconi.sglang_integration.policy_state import MarconiPolicyState
from sglang_marconi.sglang_integration import pool_bytes
from sglang_marconi.sglang_integration.stats import make_exporter

logger = logging.getLogger("sglang_marconi.cache")


def checkpoint_pool(params):
    """SGLang's int8 checkpoint pool, or None: where cached states live when on."""
    return getattr(params.req_to_token_pool, "mamba_ckpt_pool", None)


def _spec_in_pool_bytes(spec, params):
    """``spec`` with the bytes the server's pools hold (a disagreement is logged)."""
    ckpt = checkpoint_pool(params)
    state = (pool_bytes.checkpoint_bytes_per_slot(ckpt) if ckpt is not None
             else pool_bytes.state_bytes_per_slot(params.req_to_token_pool.mamba_pool))
    kv = pool_bytes.kv_bytes_per_token(params.token_to_kv_pool_allocator.get_kvcache())
    logger.info("Marconi cache: SGLang's pools hold %s B per KV token, %s B per cached "
                "state%s (cost model %s: %s B, %s B; %s)", f"{kv:,}" if kv else "?",
                f"{state:,}" if state else "?",
                f" (int8 checkpoint pool, {ckpt.num_slots:,} slots)" if ckpt else "",
                spec.name, f"{spec.kv_bytes_per_token:,}", f"{spec.ssm_state_bytes:,}",
                spec.cache_dtypes.describe() if spec.cache_dtypes else "dtypes set by hand")
    if (kv and kv != spec.kv_bytes_per_token) or (state and state != spec.ssm_state_bytes):
        logger.warning("Marconi cache: the pools' bytes differ from the cost model's; "
                       "ranking in the pools' bytes")
        return spec.with_pool_bytes(kv or 0, state or 0)
    return spec


class MarconiUnifiedRadixCache(UnifiedRadixCache):
    """``UnifiedRadixCache`` (FULL + MAMBA) whose eviction and admission follow Marconi."""

    def __init__(self, params, *, settings: Optional[MarconiSettings] = None, spec=None,
                 spec_from_pools: bool = False):
        from sglang.srt.runtime_context import mamba_checkpoint_grid

        if params.tree_components is None or ComponentType.MAMBA not in params.tree_components:
            raise ValueError("MarconiUnifiedRadixCache needs a hybrid model (FULL + MAMBA "
                             f"components), got {params.tree_components}")
        if spec is None:
            raise ValueError("MarconiUnifiedRadixCache needs the model's HybridModelSpec")
        self.unified = unified.is_unified(params)  # --enable-unified-memory: one ranking
        ckpt = checkpoint_pool(params)
        if ckpt is not None:  # cached states weigh and count as the checkpoint pool's
            spec = spec.with_int8_checkpoints()
        if spec_from_pools:  # a server's pools (replays build tiny ones: slot counts only)
            spec = _spec_in_pool_bytes(spec, params)
        self.joint_walk, self.joint_clocks = None, ClockLog()
        params = dataclasses.replace(params, component_registry_override={
            **(params.component_registry_override or {}),
            ComponentType.MAMBA: (unified.JointMambaComponent if self.unified
                                  else MarconiMambaComponent),
            ComponentType.FULL: (unified.JointFullComponent if self.unified
                                 else MarconiFullComponent),
        })
        # extra_buffer snapshots land on the mamba checkpoint grid; no_buffer (page 1)
        # keeps the exact end of each chunk and sequence.
        grid = (mamba_checkpoint_grid(params.page_size) if params.enable_mamba_extra_buffer
                else params.page_size)
        self.marconi = MarconiPolicyState(
            settings or MarconiSettings(), spec, grid=grid,
            kv_tokens=params.token_to_kv_pool_allocator.size,
            state_slots=(ckpt.num_slots if ckpt is not None
                         else params.req_to_token_pool.mamba_pool.size),
            owner=self, extra_buffer=params.enable_mamba_extra_buffer)
        self._busy = 0  # re-entrancy of the timed calls (a match may evict)
        self.marconi_exporter = None
        super().__init__(params)
        self.marconi_exporter = make_exporter(self)  # SGLang's collector exists from here
        if self.marconi_exporter is not None:
            self.marconi_exporter.set_alpha(self.marconi.alpha)
        logger.info("Marconi cache: spec=%s policy=%s max_states_per_request=%s "
                    "memory=%s%s", spec.name, self.marconi.settings.policy_name,
                    self.marconi.settings.max_states_per_request,
                    "unified (KV and states ranked together)" if self.unified else "static",
                    f", cached states in the int8 checkpoint pool ({ckpt.num_slots:,} "
                    "slots)" if ckpt is not None else "")

    def reset(self) -> None:
        """SGLang's reset (a new, empty tree), then fresh victim queues over it."""
        super().reset()
        self.joint_clocks = ClockLog()
        for ct in (ComponentType.MAMBA, ComponentType.FULL):
            self.components[ct].reset_queue()

    def rekey(self, node) -> None:
        """Re-key ``node`` in both victim queues (its weight or state changed)."""
        for ct in (ComponentType.MAMBA, ComponentType.FULL):
            self.components[ct].track(node)

    def set_tau(self, tau: float) -> None:
        """The decay ranking's time scale moved: both victim queues re-key."""
        for ct in (ComponentType.MAMBA, ComponentType.FULL):
            if self.components[ct].queue is not None:
                self.components[ct].queue.set_tau(tau)

    def rekey_chains(self, is_chain) -> None:
        """Re-key the chain nodes both victim queues hold."""
        for ct in (ComponentType.MAMBA, ComponentType.FULL):
            comp = self.components[ct]
            if comp.queue is None:
                continue
            for node in comp.queue.nodes():
                if is_chain(node):
                    comp.track(node)

    def host_write_policy(self):
        """(is_write_back, write_through_threshold) of the host tier, None without one."""
        if not self.tree_core.enable_hicache:
            return None
        return self.is_write_back, self.write_through_threshold

    # -- bookkeeping time ------------------------------------------------------------------
    def _timed(self, fn, *args, **kwargs):
        if self._busy:
            return fn(*args, **kwargs)
        self._busy += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self._busy -= 1
            self.marconi.stats.bookkeeping_seconds += time.perf_counter() - t0

    def checkpoint(self, *args, **kwargs):
        return self._timed(super().checkpoint, *args, **kwargs)

    def _match_tree(self, params):
        if params.req is not None:
            self.marconi.tick(params.req)  # before the walk: the hit's recency stamp reads the clock
        return self._timed(super()._match_tree, params)

    def _finalize_match_result(self, params, result):
        result = super()._finalize_match_result(params, result)
        if (result.mamba_branching_seqlen is not None and self.marconi.capped
                and self._extends_kv_leaf(result)):
            result = result._replace(mamba_branching_seqlen=None)
        if params.req is not None:
            result, ghost = self.marconi.ghost_branch(params.req, result)
            self.marconi.on_match(params.req, result, ghost)
        return result

    def _extends_kv_leaf(self, result) -> bool:
        """The KV match ends exactly at a childless, stateless node's end."""
        node_id = result.last_visited_node_id
        if node_id is None:
            return False
        node = self.tree_core.node_by_id(node_id)
        return (node is not None and not node.children
                and node.component_data[ComponentType.MAMBA].value is None)

    def on_release(self, req, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        self.marconi.on_release(req, finished=checkpointed)

    def evict_for_alloc(self, params, *, allocation_reclaim_satisfied=None):
        if not self.unified:
            return super().evict_for_alloc(
                params, allocation_reclaim_satisfied=allocation_reclaim_satisfied)
        return self._timed(unified.joint_evict_for_alloc, self, params,
                           super().evict_for_alloc, allocation_reclaim_satisfied)

    def _evict(self, params, *args, **kwargs):
        return self._timed(super()._evict, params, *args, **kwargs)
