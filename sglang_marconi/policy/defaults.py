"""Every default of the Marconi policy, in one place: the simulator, the settings schema
and ``ab`` read these names.
"""
from __future__ import annotations

# -- admission (the paper) --------------------------------------------------------------------
PAPER_MAX_STATES_PER_REQUEST = 2   # the branch point and the state after the last token
SERVER_MAX_STATES_PER_REQUEST = -1  # the SGLang cache: every state SGLang takes (no cap)

# -- alpha --------------------------------------------------------------------------------------
ALPHA_GRID = tuple(round(0.1 * i, 1) for i in range(21))  # the paper's tuning grid
BOOTSTRAP_MULTIPLIER = 5.0         # tune after k x (requests until the first eviction)
# the paper's ranking where no --marconi-alpha is given (ab's marconi-paper column)
PAPER_ALPHA = 1.0
ONLINE_ALPHAS = (0.0, 0.5, 1.0, 2.0)
ONLINE_WINDOW = 200                # requests the online shadows are compared over
ONLINE_PERIOD = 50                 # requests between two comparisons (simulator)
ONLINE_HYSTERESIS = 0.02           # a new alpha must beat the current one by 2%
ONLINE_SAMPLE = 1.0                # fraction of prefix families the shadows see
RENORMALISE_LIMIT = 1024           # per-walk min-max refresh up to this many candidates

# -- marconi+ -----------------------------------------------------------------------------------
BRANCH_BONUS = 2.0                 # reuse weight of a node that was ever a branch point
CHAIN_WEIGHT = None                # reuse weight of a chain state (one child, never a branch):
                                   # None: learned (likelihood.ChainUsefulness)
GHOST_FACTOR = 10.0                # ghost index tokens = factor x the KV tokens the cache holds
END_THRESHOLD = 0.05               # admit end states while their reuse rate is at least this

# -- HiCache (a host tier) ----------------------------------------------------------------------
HOST_RULE = "ranked"               # host victims by the two-tier rule (policy/host_tier.py); "lru": SGLang's

# -- serve-sim's scheduler -----------------------------------------------------------------------
SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight", "lof", "random")  # --schedule-policy
SCHEDULE_POLICY = "fcfs"           # SGLang 0.5.23's default queue order (serve-sim's)


# No per-request state cap: the SGLang plugin's default (--marconi-max-states-per-request -1)
NO_CAP = 1 << 30
CLOCK_LOG_LIMIT = 1 << 20            # counter-to-clock entries kept (policy/clock_log.py)
