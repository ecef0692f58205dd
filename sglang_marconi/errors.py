"""The one exception type for bad user input: the CLI prints it as one ``error: ...`` line and
exits with status 2; ``sglang_oom`` recognises SGLang's allocators running out of memory."""

# the first words of SGLang's allocators' RuntimeErrors (mem_cache/allocation.py)
SGLANG_OOM_PREFIXES = ("Prefill out of memory", "Decode out of memory", "Out of memory",
                       "alloc_req_slots runs out of memory")


class UserError(ValueError):
    """Bad input from the user: the message names the file/line or the field at fault."""


def sglang_oom(exc: BaseException) -> "str | None":
    """SGLang's out-of-memory error in one line (None for any other error)."""
    lines = str(exc).strip().splitlines() if isinstance(exc, RuntimeError) else [""]
    return (f"SGLang raised '{lines[0]}' ({'; '.join(x.strip() for x in lines[1:3])})"
            if lines and lines[0].startswith(SGLANG_OOM_PREFIXES) else None)
