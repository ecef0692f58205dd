"""What a SGLang server runs for ``--cache-policy marconi`` (sglang 0.5.23 exactly): the
settings and flags (``options``), the entry point (``plugin``), the radix-cache factory
(``backend``), the Marconi cache (``cache``, ``components``, ``policy_state``), the built
pools' bytes and the metrics. Importing it checks the installed sglang version first."""
from sglang_marconi.sglang_version import (SUPPORTED_SGLANG_VERSION, SGLangVersionError,
                                           check_sglang_version)

check_sglang_version()

__all__ = ["SUPPORTED_SGLANG_VERSION", "SGLangVersionError", "check_sglang_version"]
