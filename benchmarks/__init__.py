"""Measuring: retrieval, the compatibility matrix and its metrics, noise, the adapter cases and backfilling, and the
run record they write (independent of strategies); what is read from the records is :mod:`cl2r_bench.reporting`."""
