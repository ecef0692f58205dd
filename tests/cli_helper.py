"""Run a command module's ``add_arguments`` / ``run`` in-process and capture its stdout;
``ab_chat_small_pools``: the HiCache agreement tests' ``ab`` run on a chat trace."""
import argparse
import io
import json
from contextlib import redirect_stdout

from sglang_marconi.cli import ab as ab_cli
from sglang_marconi.sim.generators import generate
from sglang_marconi.sim.traces import write_sessions


def run_cli(module, *argv) -> str:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args(list(argv))
    out = io.StringIO()
    with redirect_stdout(out):
        assert module.run(args) == 0
    return out.getvalue()


def ab_chat_small_pools(tmp_path, cache: str, write_policy: str):
    """A chat trace (outputs reused, branches) through ``ab``'s ``cache`` on 60,000 KV
    tokens and 12 state slots with host pools twice the device's: (trace path, ab JSON)."""
    path = tmp_path / "chat.jsonl"
    write_sessions(generate("chat", seed=1, sessions=8, max_len=30000, user_median=2500,
                            output_median=300), path)
    argv = ["--trace", str(path), "--model", "paper-7b", "--caches", cache, "--json",
            "--per-request", "--no-progress"]
    return path, json.loads(run_cli(ab_cli, *argv, "--kv-tokens", "60000", "--mamba-slots",
                                    "12", "--hicache-ratio", "2", "--hicache-write-policy",
                                    write_policy))
