"""The one exception type for bad user input: the CLI prints it as one ``error: ...`` line and
exits with status 2; ``sglang_oom`` recognises SGLang's allocators running out of memory."""
from typing import Optional

# the first words of the RuntimeErrors SGLang's allocators raise when memory runs out
# (mem_cache/allocation.py): the scheduler process, and so the server, exits on them
SGLANG_OOM_PREFIXES = ("Prefill out of memory", "Decode out of memory", "Out of memory",
                       "alloc_req_slots runs out of memory")


class UserError(ValueError):
    """Bad input from the user: the message names the file/line or the field at fault."""


def sglang_oom(exc: BaseException) -> Optional[str]:
    """SGLang's out-of-memory error in one line (None for any other error)."""
    lines = str(exc).strip().splitlines()
    if not isinstance(exc, RuntimeError) or not lines or not lines[0].startswith(
            SGLANG_OOM_PREFIXES):
        return None
    return f"SGLang raised '{lines[0]}' ({'; '.join(x.strip() for x in lines[1:3])})"
