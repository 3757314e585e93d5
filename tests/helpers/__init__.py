"""Helpers shared by the test files (records, data files, launchers, feature pairs); tests import them from
here, never from each other."""
