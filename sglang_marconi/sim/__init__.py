"""The paper's planning simulator (``sim --paper``): traces and generators, policy names, the
replay runner, the TTFT model and plots, on ``sglang_marconi.policy``'s ``PrefixCache``."""
