"""The hybrid-model cost model: ``preset_spec(name)``, ``spec_from_config_path(path)``,
``spec_from_hf_config(config)``; ``resolve_model`` serves the CLIs' ``--model/--config``."""
from sglang_marconi.errors import UserError
from sglang_marconi.model.configs import spec_from_config_path, spec_from_hf_config
from sglang_marconi.model.presets import PRESETS, preset_spec
from sglang_marconi.model.spec import HybridModelSpec, dtype_bytes

__all__ = ["PRESETS", "HybridModelSpec", "dtype_bytes", "preset_spec", "resolve_model",
           "spec_from_config_path", "spec_from_hf_config"]


def resolve_model(preset=None, config=None, dtype=None, **server) -> HybridModelSpec:
    """The spec a CLI's ``--model`` / ``--config`` names, with the server flags."""
    if bool(preset) == bool(config):
        raise UserError("give exactly one of --model PRESET or --config PATH")
    if config:
        return spec_from_config_path(config, dtype=dtype, **server)
    return preset_spec(preset, dtype=dtype, **server)
