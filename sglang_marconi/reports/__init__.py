"""The reports the benchmark scripts write (docs/results.md, docs/beyond.md, the overhead
tables): analysis of the runs, markdown and plain-text tables, PNG plots. See README.md."""
