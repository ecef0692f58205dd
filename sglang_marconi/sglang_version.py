"""The one sglang release this integration is written against (SGLang's cache API changes in
almost every release), and the import-time check with a one-line error."""
from __future__ import annotations

from importlib import metadata

SUPPORTED_SGLANG_VERSION = "0.5.23"


class SGLangVersionError(ImportError):
    """The installed sglang is not the supported release (message is one line)."""


def installed_sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def check_sglang_version(found: str | None = None) -> str:
    """Return the installed version, or raise ``SGLangVersionError`` if it is not supported."""
    found = installed_sglang_version() if found is None else found
    if found is None:
        raise SGLangVersionError(
            f"sglang-marconi needs sglang=={SUPPORTED_SGLANG_VERSION}, which is not installed "
            f"(pip install --no-deps sglang=={SUPPORTED_SGLANG_VERSION}; see requirements/cpu.txt)"
        )
    if found != SUPPORTED_SGLANG_VERSION:
        raise SGLangVersionError(
            f"sglang-marconi supports sglang=={SUPPORTED_SGLANG_VERSION} only, found "
            f"sglang=={found} (pip install --no-deps sglang=={SUPPORTED_SGLANG_VERSION})"
        )
    return found
