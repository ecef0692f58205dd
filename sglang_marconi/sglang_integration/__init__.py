"""Marconi as an SGLang cache policy: ``--cache-policy marconi`` (sglang 0.5.23 exactly).

Modules: ``version`` (the pin), ``options`` (server flags), ``plugin`` (entry point),
``backend`` (radix-cache factory), ``cache`` / ``components`` (the Marconi cache),
``stats`` (metrics), ``pools`` / ``replay`` / ``ab`` / ``ab_cli`` (the CPU A/B).
Importing this package checks the installed sglang version first.
"""
from sglang_marconi.sglang_integration.version import (
    SUPPORTED_SGLANG_VERSION,
    SGLangVersionError,
    check_sglang_version,
)

check_sglang_version()

__all__ = ["SUPPORTED_SGLANG_VERSION", "SGLangVersionError", "check_sglang_version"]
