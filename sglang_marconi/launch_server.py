"""``python -m sglang_marconi.launch_server ...``: ``sglang.launch_server`` with the Marconi
plugin registered at module top level, so spawned scheduler processes (which re-import it as
``__mp_main__``) have the ``marconi`` backend too."""
import os
import sys

try:
    from sglang_marconi.sglang_integration.plugin import register
    from sglang_marconi.sglang_version import SGLangVersionError
except ImportError as exc:  # the sglang version check, or sglang missing entirely
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2)

register()


def main(argv=None) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()  # other plugins too, and applies the hooks register() queued
    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


__all__ = ["main", "SGLangVersionError"]

if __name__ == "__main__":
    main()
