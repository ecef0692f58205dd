"""Two "tensor-parallel ranks" as two processes under different ``PYTHONHASHSEED``
values (and different allocation noise, so object addresses differ): every policy's
decisions after every request (``tp_rank_probe``) are identical, and identical to this
process's. See ``test_tp_determinism`` for timing perturbations inside one process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from test_tp_determinism import Rank  # noqa: E402
from tp_rank_probe import digest, stream  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_ranks_in_processes_with_different_hash_seeds_agree():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                                       str(ROOT / "scripts" / "lib")]))
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "tp_rank_probe.py")],
                              env=dict(env, PYTHONHASHSEED=seed), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for seed in ("1", "4242")]  # two ranks at once, as on a server
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    assert out[0] == out[1]
    rank = Rank("marconi-a1")
    rank.run(stream(), seed=0)
    assert digest(rank.trace) == out[0]["marconi-a1"]  # and the same as this process
