"""Marconi as an SGLang cache policy: ``--cache-policy marconi`` (sglang 0.5.23 exactly).

Modules: ``version`` (the pin), ``options`` (server flags), ``plugin`` (entry point),
``backend`` (radix-cache factory), ``cache`` / ``components`` / ``policy_state`` (the
Marconi cache), ``shadow`` (alpha tuning replays), ``stats`` (metrics), ``pools`` /
``replay`` / ``ab`` / ``ab_cli`` (the CPU A/B), ``invariants`` (SGLang's cache invariants,
for tests). Importing this package checks the installed sglang version first.
"""
from sglang_marconi.sglang_integration.version import (
    SUPPORTED_SGLANG_VERSION,
    SGLangVersionError,
    check_sglang_version,
)

check_sglang_version()

__all__ = ["SUPPORTED_SGLANG_VERSION", "SGLangVersionError", "check_sglang_version"]
