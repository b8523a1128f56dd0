"""The benchmarks' own logic: reports, merges and fact checks, tested without running a benchmark."""
