"""Reporting: what is read from the run records (``metrics.json``, :mod:`benchmarks.record`) and shown to people:
the leaderboards (``leaderboard.py``), the adapter studies' answers (``adapter_recommendation.py``), the figures
(``plots.py``), the HTML report (``report.py``) and the published reference numbers (``published.py``). It measures
nothing and imports no training, model or retrieval code (an import-linter contract in ``pyproject.toml``)."""
