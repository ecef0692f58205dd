"""verify-exact: prove that resuming a request from a cached checkpoint is exact, on real
hybrid model code (tiny random-weight fp32 configs on CPU) against an uncached forward."""
