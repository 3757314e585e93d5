"""Data sets, class-incremental streams and evaluation sets (no training code here)."""
