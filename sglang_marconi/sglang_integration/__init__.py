"""What a SGLang server runs for ``--cache-policy marconi`` (sglang 0.5.23 exactly).

Modules: ``options`` (the settings schema and server flags), ``plugin`` (entry point),
``backend`` (radix-cache factory), ``cache`` / ``components`` / ``policy_state`` (the
Marconi cache), ``pool_bytes`` (the built pools' bytes), ``stats`` (metrics). The CPU harness that drives it (A/B) is
``sglang_marconi.harness`` (the invariants the tests check: ``scripts/lib/marconi_checks``);
the pools and the scheduler's call sequence it runs on are ``sglang_marconi.driver``.
Importing this package checks the installed sglang version first."""
from sglang_marconi.sglang_version import (
    SUPPORTED_SGLANG_VERSION,
    SGLangVersionError,
    check_sglang_version,
)

check_sglang_version()

__all__ = ["SUPPORTED_SGLANG_VERSION", "SGLangVersionError", "check_sglang_version"]
