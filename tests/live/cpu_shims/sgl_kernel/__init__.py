"""Stand-in for ``sgl_kernel``'s CPU build (none is on PyPI), for the live CPU test server.

SGLang's CPU engine imports ``sgl_kernel`` functions and ``torch.ops.sgl_kernel`` ops at
module load (the GDN backend, the KV cache move kernels); none of them is called outside
the model forward, which the test plugin replaces, but speculative decoding's, which the
test plugin serves with torch versions (``marconi_cpu_testkit/spec_kernels.py``). Every name here is a function that
raises if it is ever called, so a test cannot pass on a stand-in by accident. Submodules
(``sgl_kernel.mamba`` ...) are made on import by the finder below. Only the names SGLang's
CPU engine imports unconditionally exist (``STAND_INS``); every other name is absent, so
SGLang's ``try: from sgl_kernel... except ImportError`` fallbacks take their CPU paths.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class StandInCalled(RuntimeError):
    """A kernel that the CPU test server does not have was called."""


def _loud(qualname: str):
    def stand_in(*args, **kwargs):
        raise StandInCalled(f"{qualname} is a stand-in (tests/live/cpu_shims): the live CPU "
                            "test server has no sgl_kernel build; nothing outside the "
                            "replaced model forward should call it")
    stand_in.__name__ = stand_in.__qualname__ = qualname.rsplit(".", 1)[-1]
    return stand_in


# module -> the functions SGLang's CPU engine imports from it at module load
STAND_INS = {
    "sgl_kernel": (
        # mem_cache/memory_pool.py via kernels/ops/kvcache/cache_move.py
        "copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu",
        # speculative decoding's CPU helpers (imported by the model runner's modules)
        "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
        "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
        "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
    ),
    # layers/attention/linear/gdn_backend.py, the GDN / Mamba mixers' CPU kernels
    "sgl_kernel.mamba": ("causal_conv1d_fn_cpu", "causal_conv1d_update_cpu",
                         "chunk_gated_delta_rule_cpu"),
    # read as torch.ops.sgl_kernel.* (the test plugin's namespace) at module load
    "sgl_kernel.ops": ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu"),
    # kernels/ops/speculative/reconstruct_tree.py, imported by NGRAM's worker
    "sgl_kernel.speculative": ("reconstruct_indices_from_tree_mask",),
}


# module -> {name: implementation}: real ops that replace stand-ins (``provide``)
PROVIDED: dict = {}


def provide(kernels: dict) -> None:
    """Serve ``kernels`` (module -> {name: function}) in place of the loud stand-ins,
    for every later lookup (the test plugin calls it before SGLang imports the ops)."""
    for modname, funcs in kernels.items():
        unknown = set(funcs) - set(STAND_INS.get(modname, ()))
        if unknown:
            raise ValueError(f"{modname}: no stand-in named {sorted(unknown)}")
        PROVIDED.setdefault(modname, {}).update(funcs)


def _module_getattr(modname: str):
    def __getattr__(name: str):
        if name in PROVIDED.get(modname, {}):
            return PROVIDED[modname][name]
        if name in STAND_INS.get(modname, ()):
            return _loud(f"{modname}.{name}")
        raise AttributeError(f"module {modname!r} has no attribute {name!r} (CPU stand-in)")
    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + ".") and fullname in STAND_INS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _module_getattr(spec.name)
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _SubmoduleFinder())
__getattr__ = _module_getattr(__name__)
__version__ = "0.0.0+cpu-stand-in"
