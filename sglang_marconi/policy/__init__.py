"""The framework-free Marconi policy: radix tree (``tree``), admission (``admission``,
``snapshot_admission``), eviction scoring (``scoring``, ``ranking``, ``rankings``), the
planning simulator's request-level cache (``cache``) and every default (``defaults``). No
torch or sglang imports here."""
