"""Cost models whose FLOPs are easy to sum by hand, for tests of analyses that take a cost
model (only ``prefill_flops`` and ``flops_saved`` are called)."""


class LinearCost:
    """Prefill FLOPs n and a hit of h tokens saves h: a block is worth its tokens."""

    @staticmethod
    def prefill_flops(n):
        return float(n)

    @staticmethod
    def flops_saved(h, p=0):
        return float(h - p)


class SquareCost:
    """Prefill FLOPs n**2 and a hit of h tokens saves h**2: a deeper block is worth more
    than the one before."""

    @staticmethod
    def prefill_flops(n):
        return float(n * n)

    @staticmethod
    def flops_saved(h, p=0):
        return float(h * h - p * p)
