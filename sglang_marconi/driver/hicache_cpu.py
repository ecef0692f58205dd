"""SGLang's HiCache on CPU: the device <-> host copy kernels replaced by torch index copies and
host memory left unpinned (``install``, ``unpin``), SGLang's host-memory budget scope and a
one-rank topology; tests and offline tools only, a GPU server never imports it."""
from __future__ import annotations

from typing import Optional

_installed = False


def _host_layer(buffer, layer_id: int, layout: str):
    """One layer of a Mamba host buffer, slots first."""
    if layout in ("page_first", "page_first_direct"):
        return buffer[:, layer_id, 0]  # (size, layers, 1, *state)
    return buffer[layer_id]  # layer_first: (layers, size, *state)


def _index_copy(dst, dst_indices, src, src_indices) -> None:
    """``dst[dst_indices] = src[src_indices]`` (the kernels' semantics), any strides."""
    import torch  # heavy: only a caller that builds pools gets here

    if src_indices.numel() == 0:
        return
    src_idx = src_indices.reshape(-1).to(device=src.device, dtype=torch.long)
    dst_idx = dst_indices.reshape(-1).to(device=dst.device, dtype=torch.long)
    dst[dst_idx] = src[src_idx].to(dst.device)


def _kv_check(pool, io_backend: str) -> None:
    if io_backend != "kernel" or pool.layout not in ("page_first", "layer_first"):
        raise NotImplementedError(
            f"CPU HiCache stand-in: KV host layout {pool.layout!r} with io backend "
            f"{io_backend!r} (supported: page_first or layer_first, kernel)")


def kv_load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id,
                                io_backend, *, is_draft: bool = False) -> None:
    """``MHATokenToKVPoolHost.load_to_device_per_layer`` as torch index copies."""
    _kv_check(self, io_backend)
    if not is_draft and not 0 <= layer_id < self.target_layer_num:
        return
    _index_copy(self.device_k_buffers[layer_id], device_indices,
                self.k_data_refs[layer_id], host_indices)
    _index_copy(self.device_v_buffers[layer_id], device_indices,
                self.v_data_refs[layer_id], host_indices)


def kv_backup_from_device_all_layer(self, device_pool, host_indices, device_indices,
                                    io_backend) -> None:
    """``MHATokenToKVPoolHost.backup_from_device_all_layer`` as torch index copies."""
    _kv_check(self, io_backend)
    for layer_id in range(self.layer_num):
        _index_copy(self.k_data_refs[layer_id], host_indices,
                    self.device_k_buffers[layer_id], device_indices)
        _index_copy(self.v_data_refs[layer_id], host_indices,
                    self.device_v_buffers[layer_id], device_indices)


def _mamba_layers(self):
    temporal = (self.temporal_device_layers if self.mtp_draft_buffer_infos
                else self.buffer_info.temporal)
    conv = (self.conv_device_layers if self.mtp_draft_buffer_infos else self.buffer_info.conv)
    return temporal, conv


def mamba_load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id,
                                   io_backend="kernel", *, is_draft: bool = False) -> None:
    """``MambaPoolHost.load_to_device_per_layer`` as torch index copies."""
    temporal, conv = _mamba_layers(self)
    if layer_id == 0:
        self._transfer_slot_states(host_indices, device_indices, to_device=True)
    if self.temporal_state_elem_size > 0:
        _index_copy(temporal[layer_id], device_indices,
                    _host_layer(self.temporal_buffer, layer_id, self.layout), host_indices)
    for i in range(len(self.conv_state_shapes)):
        _index_copy(conv[i][layer_id], device_indices,
                    _host_layer(self.conv_buffer[i], layer_id, self.layout), host_indices)


def mamba_backup_from_device_all_layer(self, device_pool, host_indices, device_indices,
                                       io_backend="kernel") -> None:
    """``MambaPoolHost.backup_from_device_all_layer`` as torch index copies."""
    temporal, conv = _mamba_layers(self)
    for layer_id in range(self.num_mamba_layers):
        if self.temporal_state_elem_size > 0:
            _index_copy(_host_layer(self.temporal_buffer, layer_id, self.layout), host_indices,
                        temporal[layer_id], device_indices)
        for i in range(len(self.conv_state_shapes)):
            _index_copy(_host_layer(self.conv_buffer[i], layer_id, self.layout), host_indices,
                        conv[i][layer_id], device_indices)
    self._transfer_slot_states(host_indices, device_indices, to_device=False)


def _alloc_unregistered(dims, dtype, device, pin_memory, allocator,
                        registration_granularity_bytes: Optional[int] = None):
    """``alloc_with_host_register`` without ``cudaHostRegister``."""
    return allocator.allocate(dims, dtype=dtype, device=device)


def host_budget():
    """SGLang's ``host_memory_budget_scope`` over the available host memory, no reserve."""
    # heavy: sglang, imported only by a caller that builds host pools
    from sglang.srt.mem_cache.host_memory import available_host_memory_bytes
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    return host_memory_budget_scope(available_host_memory_bytes())


def unpin(cache) -> None:
    """The built host pools allocate no more page-locked tensors (L3 page staging)."""
    for entry in cache.host_pool_group.entries:
        entry.host_pool.pin_memory = False


def single_rank():
    """State the single-rank topology the L3 backend reads (no process group on CPU)."""
    from sglang.srt.runtime_context import get_parallel  # heavy: sglang

    return get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)


def install() -> None:
    """Patch SGLang's host pools for a machine without a GPU (idempotent)."""
    global _installed
    if _installed:
        return
    # heavy: sglang's host pools, imported only where HiCache is built on CPU
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    MHATokenToKVPoolHost.load_to_device_per_layer = kv_load_to_device_per_layer
    MHATokenToKVPoolHost.backup_from_device_all_layer = kv_backup_from_device_all_layer
    MambaPoolHost.load_to_device_per_layer = mamba_load_to_device_per_layer
    MambaPoolHost.backup_from_device_all_layer = mamba_backup_from_device_all_layer
    common.ALLOC_MEMORY_FUNCS["cpu"] = _alloc_unregistered
    _installed = True
