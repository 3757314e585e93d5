"""The errors and name checks every part of the suite shares; this module imports nothing of the suite, so any part
can raise them without importing another.

Each error carries one line saying what is wrong and how to fix it; the command line prints it and exits with code 2
(:mod:`cl2r_bench.app.cli`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=,-]{0,99}")


class ConfigError(ValueError):
    """A config file, key or value is invalid; the message says which and how to fix it."""


class UsageError(Exception):
    """Bad command-line input."""


class PartError(ValueError):
    """An unknown strategy, adapter or scenario, or invalid parameters of one (a one-line message)."""


class PluginError(PartError):
    """A plug-in file that is missing, fails to import or exits while it is imported (:mod:`cl2r_bench.plugins`)."""


def safe_name(name: object, setting: str) -> str:
    """``name`` when it can be one path component (letters, digits and ``_ . + = , -``, not starting with a dot,
    at most 100 characters), else a :class:`ConfigError`: no setting may lead a run to write or delete outside its
    output folder."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"{setting} = {name!r} cannot name a results folder; use letters, digits and _ . + = , - "
                          "(no /, no leading dot, no '..', at most 100 characters)")
    return name


def writable_folder(path: str | Path, setting: str) -> Path:
    """``path`` when it is, or can be made, a folder this process writes in: not empty, no existing part of it a
    file, and its nearest existing folder writable; else a one-line :class:`ConfigError` naming ``setting`` (issue
    29), raised before any data is read."""
    if not str(path).strip():
        raise ConfigError(f"{setting} is empty; give a folder (e.g. results)")
    folder = Path(path)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{setting} = {path}: {existing} is a file, not a folder; give another folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{setting} = {path}: {existing} is not writable; give a folder you can write in")
    return folder
