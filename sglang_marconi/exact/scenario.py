"""The request sequence verify-exact serves (five requests over three conversations sharing a
system prompt) and the check that resuming from each hit matches an uncached forward;
``ssm_offset`` is the negative control, which must fail."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from sglang_marconi.exact import runner, snapshot
from sglang_marconi.exact.archs import VOCAB, Arch, build_model
from sglang_marconi.exact.store import CheckpointStore
from sglang_marconi.model import spec_from_hf_config
from sglang_marconi.policy.cache import PrefixCache
from sglang_marconi.policy.tree import as_tokens, common_prefix_len

TOLERANCE = 1e-4  # max |logit difference|; fp32, |logits| ~ 3; rounding noise stays < 7e-5
STATE_RTOL = 1e-4  # max |state difference| / max |state| for the reference-scan cross-check
SYSTEM_LEN, USER_LEN, N_DECODE = 24, 7, 16


@dataclass
class RequestResult:
    name: str
    input_len: int
    hit_len: int
    checkpoint_positions: list  # mid-prompt positions the tree asked for
    expected_positions: list  # the branch points of the request sequence (oracle)
    expected_hit_len: int  # the longest checkpointed prefix (oracle)
    stored_positions: list  # every position that got a checkpoint at finish
    next_token_max_abs_diff: float
    continuation_max_abs_diff: float
    tokens_match: bool
    output: list = field(default_factory=list)


@dataclass
class ArchResult:
    arch: str
    seed: int
    tolerance: float
    requests: list
    max_abs_logit_diff: float
    tokens_match: bool
    positions_match: bool
    branch_hits: int  # requests that resumed from a mid-prompt (branch-point) state
    output_hits: int  # requests that resumed from an end-of-request state
    checkpoint_bytes_match_cost_model: bool | None
    ssd_crosscheck: dict | None
    ssm_offset: int = 0
    states_evicted: int = 0  # states the tree evicted (their tensors left the store)

    @property
    def passed(self) -> bool:
        ssd_ok = self.ssd_crosscheck is None or self.ssd_crosscheck["passed"]
        return (self.max_abs_logit_diff <= self.tolerance and self.tokens_match
                and self.positions_match and self.branch_hits > 0 and self.output_hits > 0
                and ssd_ok)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _requests(seed: int):
    """(name, conversation, turn tokens) in order; a follow-up extends its conversation."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(0, VOCAB, (SYSTEM_LEN,), generator=g).tolist()
    firsts = torch.randperm(VOCAB, generator=g)[:5].tolist()  # distinct first tokens
    users = [[f] + torch.randint(0, VOCAB, (USER_LEN - 1,), generator=g).tolist() for f in firsts]
    return [
        ("conv1-turn1", 1, system + users[0]),
        ("conv2-turn1", 2, system + users[1]),
        ("conv2-turn2", 2, users[2]),
        ("conv3-turn1", 3, system + users[3]),
        ("conv1-turn2", 1, users[4]),
    ]


class BranchOracle:
    """Where Marconi must checkpoint, from the token sequences alone (no tree): the hit is the
    longest checkpointed prefix; the branch point, the longest common prefix with an earlier
    sequence ending inside the input, gets a checkpoint if beyond the hit."""

    def __init__(self) -> None:
        self.sequences: list[list[int]] = []
        self.checkpoints: set[tuple] = set()

    def expected(self, tokens) -> tuple[int, list[int]]:
        hit = max((p for p in range(len(tokens)) if tuple(tokens[:p]) in self.checkpoints),
                  default=0)
        inside = [n for s in self.sequences
                  if (n := common_prefix_len(as_tokens(tokens), as_tokens(s))) < len(s)]
        branch = max(inside, default=0)
        return hit, ([branch] if hit < branch < len(tokens) else [])

    def record(self, full_tokens, positions) -> None:
        self.sequences.append(list(full_tokens))
        self.checkpoints.update(tuple(full_tokens[:p]) for p in positions)


def make_cache(spec, capacity_bytes=None):
    """The project's prefix cache: grid 1, Marconi admission, LRU (unlimited by default)."""
    return PrefixCache(spec, capacity_bytes=capacity_bytes, grid=1, max_states_per_request=2,
                       alpha=0.0)


def run_arch(arch: Arch, seed: int = 0, ssm_offset: int = 0, n_decode: int = N_DECODE,
             tolerance: float = TOLERANCE, crosscheck: bool = True,
             keep_dt_clamp: bool = False, capacity_bytes: int | None = None) -> ArchResult:
    """Serve the request sequence on ``arch`` and compare with uncached (one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_arch(arch, seed, ssm_offset, n_decode, tolerance, crosscheck, keep_dt_clamp,
                         capacity_bytes)
    finally:
        torch.set_num_threads(threads)


def _run_arch(arch, seed, ssm_offset, n_decode, tolerance, crosscheck, keep_dt_clamp,
              capacity_bytes):
    model = build_model(arch, seed, keep_dt_clamp=keep_dt_clamp)
    # transformers holds every state in the model's dtype (float32 here), not SGLang's
    spec = spec_from_hf_config(model.config, dtype="float32", mamba_ssm_dtype="float32",
                               env={"SGLANG_MAMBA_CONV_DTYPE": "float32"})
    server = _Server(arch, model, spec, make_cache(spec, capacity_bytes), ssm_offset, n_decode,
                     crosscheck and arch.ssm_family == "mamba2")
    history: dict[int, list[int]] = {}
    results = []
    for name, conv, turn in _requests(seed):
        tokens = history.get(conv, []) + turn
        results.append(server.serve(name, tokens))
        history[conv] = tokens + results[-1].output

    ssd = None
    if server.state_checks:
        worst = max(server.state_checks)
        ssd = {"checked_states": len(server.state_checks), "max_rel_diff": worst,
               "rtol": STATE_RTOL, "passed": worst <= STATE_RTOL}
    return ArchResult(
        arch=arch.name, seed=seed, tolerance=tolerance, requests=results,
        max_abs_logit_diff=max(max(r.next_token_max_abs_diff, r.continuation_max_abs_diff)
                               for r in results),
        tokens_match=all(r.tokens_match for r in results),
        positions_match=all(r.checkpoint_positions == r.expected_positions
                            and r.hit_len == r.expected_hit_len for r in results),
        branch_hits=server.branch_hits, output_hits=server.output_hits,
        checkpoint_bytes_match_cost_model=server.bytes_ok, ssd_crosscheck=ssd,
        ssm_offset=ssm_offset, states_evicted=len(server.store.evicted),
    )


class _Server:
    """Serves requests one at a time: tree plan, resume, two-pass prefill, decode, admit."""

    def __init__(self, arch, model, spec, cache, ssm_offset, n_decode, crosscheck):
        self.arch, self.model, self.spec, self.cache = arch, model, spec, cache
        self.ssm_offset, self.n_decode, self.crosscheck = ssm_offset, n_decode, crosscheck
        self.store, self.oracle = CheckpointStore(), BranchOracle()
        cache.on_evict = self.store.on_evict
        self.branch_prefixes: set[tuple] = set()  # prefixes whose state was taken mid-prompt
        self.branch_hits = self.output_hits = 0
        self.bytes_ok = True
        self.state_checks: list[float] = []

    def serve(self, name: str, tokens: list[int]) -> RequestResult:
        exp_hit, exp_positions = self.oracle.expected(tokens)
        plan = self.cache.begin(tokens)
        kv_cache = self._resume(name, plan, tokens)
        positions = list(plan.checkpoint_positions)
        taken: dict[int, dict] = {}  # position -> SSM states taken there

        def on_split(pos, c):
            taken[pos - self.ssm_offset] = snapshot.take_ssm_states(c)

        last = runner.segmented_prefill(self.model, self.arch, kv_cache, tokens, plan.hit_len,
                                        [p + self.ssm_offset for p in positions], on_split)
        output, step_logits = runner.greedy_decode(self.model, self.arch, kv_cache, last,
                                                   len(tokens), self.n_decode)
        full = tokens + output[:-1]
        taken[len(full)] = snapshot.take_ssm_states(kv_cache)
        nodes = self._admit(name, plan, tokens, full, kv_cache, taken)
        self.oracle.record(full, exp_positions + [len(full)])

        ref_steps = self._reference(full, {p: taken[p] for p in nodes}, plan.hit_len)
        ref_steps = ref_steps[len(tokens) - 1:]
        diffs = (step_logits - ref_steps).abs().amax(dim=-1)
        return RequestResult(
            name=name, input_len=len(tokens), hit_len=plan.hit_len,
            checkpoint_positions=positions, expected_positions=exp_positions,
            expected_hit_len=exp_hit, stored_positions=sorted(nodes),
            next_token_max_abs_diff=float(diffs[0]),
            continuation_max_abs_diff=float(diffs[1:].max()) if len(diffs) > 1 else 0.0,
            tokens_match=torch.argmax(ref_steps, dim=-1).tolist() == output, output=output,
        )

    def _resume(self, name, plan, tokens):
        """A cache restored from the hit's checkpoint, or a fresh one."""
        hit = plan.hit_len
        if not hit:
            return snapshot.DynamicCache(config=self.model.config)
        if hit >= len(tokens):
            raise RuntimeError(f"{name}: hit of {hit} covers the whole input of {len(tokens)}")
        if tuple(tokens[:hit]) in self.branch_prefixes:
            self.branch_hits += 1
        else:
            self.output_hits += 1
        return snapshot.restore(self.model.config, self.store.get(plan.hit_node.id, hit))

    def _admit(self, name, plan, tokens, full, kv_cache, taken) -> dict:
        """``cache.finish`` and the tensors of every checkpoint it stored."""
        nodes = self.cache.finish(plan, full)
        for pos, node in sorted(nodes.items()):
            if pos not in taken:
                raise RuntimeError(f"{name}: the tree stored a state at {pos}, which this "
                                   f"prefill was not asked to take (asked: "
                                   f"{list(plan.checkpoint_positions)})")
            ckpt = snapshot.Checkpoint(pos, snapshot.take_kv(kv_cache, pos), taken[pos])
            model_bytes = pos * self.spec.kv_bytes_per_token + self.spec.ssm_state_bytes
            self.bytes_ok &= ckpt.nbytes == model_bytes
            self.store.put(node.id, ckpt)
            if pos < len(tokens):
                self.branch_prefixes.add(tuple(tokens[:pos]))
        _check_store_matches_tree(self.cache, self.store)
        return nodes

    def _reference(self, full, states_at, hit):
        """Uncached logits over ``full`` (and, for Mamba2, the reference-scan state check)."""
        if not self.crosscheck:
            return runner.uncached_logits(self.model, full)
        ref, checks = _crosscheck(self.model, self.arch, full, states_at, hit)
        self.state_checks += checks
        return ref


def _check_store_matches_tree(cache, store) -> None:
    """Every tree node that holds a state has tensors in the store, and nothing else does."""
    in_tree = {n.id for n in cache.tree.iter_nodes() if n.has_state}
    if in_tree != store.node_ids:
        raise RuntimeError(f"tree states {sorted(in_tree)} != stored tensors "
                           f"{sorted(store.node_ids)}")


def _crosscheck(model, arch, full, states_at, hit):
    """Uncached reference logits, and stored Mamba2 states vs the reference scan's."""
    from sglang_marconi.exact.ssd_reference import record_scan_inputs, reference_state

    with record_scan_inputs(model, arch.modeling_module) as rec:
        ref_logits = runner.uncached_logits(model, full)
    out = []
    for pos, layers in states_at.items():
        resume = hit if 0 < hit < pos else pos // 2
        for idx, state in layers.items():
            ours = state.recurrent[0]
            ref = reference_state(rec[idx], pos, resume_at=resume)
            out.append(float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-30)))
    return ref_logits, out
