"""Test-only SGLang plugin: SGLang's real server on a CPU-only machine, forward replaced.

Loaded through the entry point group ``sglang.srt.plugins`` in every process SGLang
starts (``marconi_cpu_testkit-0.1.dist-info`` beside this folder: the folder is put on
``PYTHONPATH`` of the test servers only, nothing is installed). It acts only when
``MARCONI_CPU_TESTKIT=1``. Every replacement, and why (docs/live_server.md):

1. ``<Model>ForCausalLM.forward`` of the tiny hybrid models (Qwen3-Next, Nemotron-H):
   the embedding of the input ids goes straight to the model's real logits processor,
   whose next-token logits are then set to pick a lowercase letter that depends only on
   the sequence length (``'a' + len % 26``): outputs are text that re-tokenizes to the
   same ids (multi-turn chat continues exactly), the same in every server (a speculative
   verify row gets the letter of its draft's position + 1, so NGRAM's drafts of earlier
   output are accepted as a plain decode would emit them). The GDN /
   Mamba2 mixers' kernels exist for CUDA only. ModelRunner, the pools, the radix cache
   (stock or Marconi), copy-on-write of states, sampling and the scheduler stay SGLang's:
   cache decisions and ``cached_tokens`` are real; no KV or SSM contents are written, so
   output tokens are not the model's.
2. ``sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer``
   answers True: extra_buffer (and so the overlap loop with a hybrid model) asserts a
   GPU-type platform; nothing of it needs one once the forward is replaced.
3. ``torch.ops.sgl_kernel``: the CPU engine reads a few ops at module load; they are
   stand-ins that raise if called; every other op name looks absent to ``hasattr``, as on
   a machine without the AMX build (``utils/patch_torch.py`` register_fake_if_exists, the
   AMX probe, ``models/utils.py`` fused qk-norm probe).
4. With ``MARCONI_CPU_TESTKIT_FORWARD=real`` the model's own forward runs instead of 1.,
   on torch versions of the ``sgl_kernel`` GDN ops and of the few Triton kernels a CPU
   without AMX reaches (``torch_kernels.py``), and of the Mamba2 mixer's causal conv and
   scans (``mamba2_kernels.py``: Triton kernels, or names SGLang binds on GPUs only);
   ``MARCONI_CPU_TESTKIT_PERTURB_STATE=x`` scales every state ``MambaPool.copy_from``
   copies by ``1 + x`` (the exactness tests' negative control).
   With ``--enable-int8-mamba-checkpoint`` the int8 audit (``int8_audit.py``) keeps the
   full-precision state of every checkpoint SGLang stores and checks each load against
   ``Int8CheckpointStore``'s round trip of it, bitwise (a line per load in the log); the
   perturbation scales the loaded states too.
5. torch here is a CUDA build without a driver: ``torch.get_device_module()`` with no
   argument answers ``torch.cpu`` and ``Tensor.pin_memory()`` returns the tensor
   (``models/qwen3_next.py``, ``managers/schedule_batch.py`` extra_buffer track mask);
   ``torch.cuda.current_stream()`` answers a stream whose waits return at once (CPU work
   is synchronous: the unified allocator's ``_settle_inflight_forward``,
   ``mem_cache/allocator/unified_sub_pool.py`` ~1810, under ``--enable-unified-memory``).
5. HiCache (``--enable-hierarchical-cache``): the host pools' device <-> host copies
   (CUDA/HIP kernels) become torch index copies and their buffers are not
   ``cudaHostRegister``-ed (``sglang_marconi.driver.hicache_cpu.install``, the same
   stand-ins as the CPU test stack); the 10 GiB host-memory reserve SGLang keeps beside
   its host pools (``pool_host/base.py`` ``HICACHE_HOST_MEMORY_RESERVE_BYTES``) is 0, the
   test servers' host pools taking a few kilobytes.
6. Speculative decoding's CPU ops (NGRAM's verify path, in the scheduler process, with
   either forward): torch versions (``spec_kernels.py``) of the ``sgl_kernel`` cache-slot,
   tree and KV-move ops and of the Mamba verify commit's scatters (CUDA/XPU-only Triton).
"""
from __future__ import annotations

import importlib
import logging
import os

import sgl_kernel  # the stand-in package beside this one
from sgl_kernel import STAND_INS, ops

logger = logging.getLogger("marconi_cpu_testkit")

FORWARDS = (
    "sglang.srt.models.qwen3_next.Qwen3NextForCausalLM.forward",
    "sglang.srt.models.nemotron_h.NemotronHForCausalLM.forward",
)
EXTRA_BUFFER_PLATFORM = \
    "sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer"
MAMBA_COPY = "sglang.srt.mem_cache.memory_pool.MambaPool.copy_from"
FORWARD_MODES = ("replaced", "real")
_done = False


def forward_mode() -> str:
    """``MARCONI_CPU_TESTKIT_FORWARD``: ``replaced`` (default) or ``real``."""
    mode = os.environ.get("MARCONI_CPU_TESTKIT_FORWARD", "replaced")
    if mode not in FORWARD_MODES:
        raise ValueError(f"MARCONI_CPU_TESTKIT_FORWARD={mode!r}: expected one of "
                         f"{', '.join(FORWARD_MODES)}")
    return mode


class _SglKernelOps:
    """``torch.ops.sgl_kernel``: loud stand-ins for the ops read at import, absent others."""

    def __getattr__(self, name):
        if name in STAND_INS["sgl_kernel.ops"]:
            return getattr(ops, name)
        raise AttributeError(f"torch.ops.sgl_kernel.{name} (absent in the CPU test server)")


def perturb_scale() -> float:
    """``MARCONI_CPU_TESTKIT_PERTURB_STATE``: the negative control of the exactness tests;
    every SSM state ``MambaPool.copy_from`` copies (a matched state copied into the
    request's slot, a snapshot copied into the tree) is scaled by ``1 + value``."""
    raw = os.environ.get("MARCONI_CPU_TESTKIT_PERTURB_STATE", "0")
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"MARCONI_CPU_TESTKIT_PERTURB_STATE={raw!r}: expected a number")


def perturbed_copy_from(original, self, src_indices, dst_indices):
    """``MambaPool.copy_from``, then the copied SSM states scaled (negative control)."""
    original(self, src_indices, dst_indices)
    self.mamba_cache.temporal[:, dst_indices] *= 1.0 + perturb_scale()


def replaced_forward(self, input_ids, positions, forward_batch, *args, **kwargs):
    """Embed the ids and hand them to the model's own logits processor (no mixer runs);
    the next token is the letter ``'a' + seq_len % 26`` of each sequence."""
    hidden = self.get_input_embeddings()(input_ids)
    out = self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)
    logits = out.next_token_logits
    seq = _next_positions(logits, forward_batch)
    if seq is not None:
        target = ord("a") + seq % 26
        logits.fill_(-30.0)
        logits.scatter_(1, target[:, None], 30.0)
    return out


def _next_positions(logits, forward_batch):
    """The sequence position each logits row predicts: the sequence length (one row per
    sequence), or under speculative verify (one row per draft token) the draft's
    position + 1, so verified drafts get the letters a plain decode gives."""
    if logits is None:
        return None
    if forward_batch.forward_mode.is_target_verify():
        seq = forward_batch.positions
    else:
        seq = forward_batch.seq_lens - 1
    return seq.to(logits.device).long() + 1 if logits.shape[0] == seq.shape[0] else None


def bind_absent(module_name: str, names: dict) -> None:
    """Set ``names`` on ``module_name``, which binds them on GPU platforms only (absent on
    CPU, so a HookRegistry REPLACE cannot resolve them); a name already bound is an error
    (this would replace a real kernel)."""
    module = importlib.import_module(module_name)
    present = sorted(n for n in names if hasattr(module, n))
    if present:
        raise RuntimeError(f"{module_name} already binds {present}: not a CPU build")
    for name, fn in names.items():
        setattr(module, name, fn)


def _extra_buffer_supported() -> bool:
    return True


class _SynchronousStream:
    """The current stream of a machine without a GPU: every wait is already satisfied."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


def register() -> None:
    global _done
    if _done or os.environ.get("MARCONI_CPU_TESTKIT") != "1":
        return
    import torch  # heavy, and only in a process that serves with the test kit on
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    original_get_device_module = torch.get_device_module

    def get_device_module(device=None):
        return torch.cpu if device is None else original_get_device_module(device)

    torch.get_device_module = get_device_module
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    if not torch.cuda.is_available():
        torch.cuda.current_stream = lambda device=None: _SynchronousStream()
    setattr(torch.ops, "sgl_kernel", _SglKernelOps())
    from marconi_cpu_testkit import spec_kernels  # speculative decoding's CPU ops
    sgl_kernel.provide(spec_kernels.KERNELS)
    for target, fn in spec_kernels.BINDINGS.items():
        HookRegistry.register(target, fn, HookType.REPLACE)
    if forward_mode() == "replaced":
        for target in FORWARDS:
            HookRegistry.register(target, replaced_forward, HookType.REPLACE)
    else:
        # heavy: transformers and SGLang's mixer module, real forward only
        from marconi_cpu_testkit import mamba2_kernels, torch_kernels
        sgl_kernel.provide(torch_kernels.KERNELS)
        for target, fn in {**torch_kernels.FORWARD_REPLACEMENTS,
                           **mamba2_kernels.FORWARD_REPLACEMENTS}.items():
            HookRegistry.register(target, fn, HookType.REPLACE)
        for module, names in mamba2_kernels.MODULE_BINDINGS.items():
            bind_absent(module, names)
    if perturb_scale():
        HookRegistry.register(MAMBA_COPY, perturbed_copy_from, HookType.AROUND)
    from marconi_cpu_testkit import int8_audit
    for target, fn in int8_audit.hooks(perturb_scale()).items():
        HookRegistry.register(target, fn, HookType.AROUND)
    HookRegistry.register(EXTRA_BUFFER_PLATFORM, _extra_buffer_supported, HookType.REPLACE)
    from sglang.srt.mem_cache.pool_host import base as host_pool_base

    from sglang_marconi.driver import hicache_cpu

    hicache_cpu.install()
    host_pool_base.HICACHE_HOST_MEMORY_RESERVE_BYTES = 0
    _done = True
    logger.warning("marconi_cpu_testkit: model forward %s, CPU shims active (tests only)",
                   "replaced" if forward_mode() == "replaced" else
                   "real (torch versions of the sgl_kernel GDN ops and the Mamba2 "
                   "Triton kernels)")
