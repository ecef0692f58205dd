"""The hybrid-model cost model: bytes per KV token and per SSM checkpoint, prefill FLOPs and
FLOPs saved by a hit, derived from a model's config (see ``spec``, ``configs``, ``presets``)."""
from sglang_marconi.model.spec import HybridModelSpec, dtype_bytes

__all__ = ["HybridModelSpec", "dtype_bytes", "resolve_model"]


def resolve_model(preset=None, config=None, dtype=None) -> HybridModelSpec:
    """The spec a CLI's ``--model PRESET`` / ``--config PATH`` pair names."""
    from sglang_marconi.errors import UserError

    if bool(preset) == bool(config):
        raise UserError("give exactly one of --model PRESET or --config PATH")
    if config:
        return HybridModelSpec.from_config_path(config, dtype=dtype)
    return HybridModelSpec.from_preset(preset, dtype=dtype)
