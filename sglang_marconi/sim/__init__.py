"""The trace-driven simulator: traces and generators, policy names, the replay runner, the
TTFT model and plots. It drives ``sglang_marconi.policy`` exactly as the SGLang cache does."""
