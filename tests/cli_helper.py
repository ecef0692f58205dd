"""Run a command module's ``add_arguments`` / ``run`` in-process and capture its stdout."""
import argparse
import io
from contextlib import redirect_stdout


def run_cli(module, *argv) -> str:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args(list(argv))
    out = io.StringIO()
    with redirect_stdout(out):
        assert module.run(args) == 0
    return out.getvalue()
