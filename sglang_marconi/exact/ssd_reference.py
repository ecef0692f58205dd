"""Independent cross-check of Mamba2 states with mamba-ssm's minimal SSD reference scan, loaded
by path with stub modules for its CUDA imports (removed afterwards: transformers must keep
seeing mamba_ssm as absent)."""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import types
from functools import lru_cache

import torch
import torch.nn.functional as F

# package file -> (the modules it imports that are stubbed while it loads: {name: attrs})
_REFERENCE_FILES = {
    ("mamba_ssm", "modules/ssd_minimal.py"): {
        "mamba_ssm.ops.triton.ssd_combined": ("mamba_chunk_scan_combined",)},
    ("mamba_ssm", "ops/triton/selective_state_update.py"): {
        "mamba_ssm.ops.triton.softplus": ("softplus",)},
    ("causal_conv1d", "causal_conv1d_interface.py"): {
        "causal_conv1d.cpp_functions": ("causal_conv1d_fwd_function",
                                        "causal_conv1d_bwd_function",
                                        "causal_conv1d_update_function")},
}


def _parents(name: str) -> list:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@lru_cache(maxsize=None)
def _load_reference_file(package: str, relative: str):
    """One file of ``package`` loaded under a private name, CUDA imports stubbed."""
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed (see requirements/no-deps.txt)")
    stubs = _REFERENCE_FILES[(package, relative)]
    names = sorted({p for stubbed in stubs for p in _parents(stubbed)})
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names:
            stub = types.ModuleType(name)
            stub.__path__ = []  # a package, so the dotted import resolves
            for attr in stubs.get(name, ()):
                setattr(stub, attr, None)  # imported, never called by the references
            sys.modules[name] = stub
        path = f"{list(spec.submodule_search_locations)[0]}/{relative}"
        private = "_marconi_ref_" + relative.replace("/", "_").removesuffix(".py")
        file_spec = importlib.util.spec_from_file_location(private, path)
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


def load_ssd_minimal():
    """mamba-ssm's ``ssd_minimal_discrete``, loaded from its file (see module docstring)."""
    return _load_reference_file("mamba_ssm", "modules/ssd_minimal.py").ssd_minimal_discrete


@contextlib.contextmanager
def record_scan_inputs(model, modeling_module: str):
    """Yield layer_idx -> the chunk-scan arguments of each Mamba2 layer of ``model``."""
    mod = importlib.import_module(modeling_module)
    original = mod.mamba2_chunk_scan
    signature = inspect.signature(original)
    records: dict[int, dict] = {}
    current = {"layer": None}

    def recorder(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        records[current["layer"]] = {k: (v.detach().clone() if torch.is_tensor(v) else v)
                                     for k, v in bound.arguments.items()}
        return original(*args, **kwargs)

    def pre_hook(module, args):
        current["layer"] = module.layer_idx

    hooks = [m.register_forward_pre_hook(pre_hook) for m in model.modules()
             if hasattr(m, "A_log") and hasattr(m, "layer_idx")]
    mod.mamba2_chunk_scan = recorder
    try:
        yield records
    finally:
        mod.mamba2_chunk_scan = original
        for h in hooks:
            h.remove()


def reference_state(rec: dict, position: int, resume_at: int | None = None, block_len: int = 8):
    """SSM state after ``position`` tokens from recorded scan inputs, by the reference scan:
    Mamba2's discretisation, then ``ssd_minimal_discrete`` over [0, resume_at) and
    [resume_at, position) from the first chunk's final state."""
    ssd = load_ssd_minimal()
    x, dt, A, B, C = (rec[k] for k in ("hidden_states", "dt", "A", "B", "C"))
    if rec.get("dt_bias") is not None:
        dt = dt + rec["dt_bias"]
    if rec.get("dt_softplus"):
        dt = F.softplus(dt)
    lo, hi = rec.get("dt_limit", (0.0, float("inf")))
    dt = torch.clamp(dt, min=lo, max=hi).float()
    heads = x.shape[2]
    B = B.float().repeat_interleave(heads // B.shape[2], dim=2)
    C = C.float().repeat_interleave(heads // C.shape[2], dim=2)
    X = x.float() * dt[..., None]
    A_dt = A.float() * dt

    def scan(start, end, init):
        parts = [t[:, start:end] for t in (X, A_dt, B, C)]
        pad = (-(end - start)) % block_len
        # zero padding at the end: dA = 0 (decay exp(0) = 1) and x = 0 leave the state alone
        parts = [F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in parts]
        _, final = ssd(*parts, block_len, initial_states=None if init is None else init[:, None])
        return final

    resume_at = position // 2 if resume_at is None else resume_at
    state = scan(0, resume_at, None) if resume_at > 0 else None
    return scan(resume_at, position, state)
