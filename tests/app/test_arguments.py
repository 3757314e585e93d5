"""Every number option of every command (cl2r_bench/app/arguments.py and the options each command adds) declares
the values it takes beside it (``type=number(...)``, cl2r_bench/limits.py) and refuses one outside them in one line
while the command line is parsed, before anything is read or allocated: the command line's counterpart of
tests/plugins/test_plugin_settings.py, which walks every setting. A new option is covered here without a new test."""
import argparse
import math

import pytest

from cl2r_bench.app.arguments import build_parser
from cl2r_bench.app.cli import main
from cl2r_bench.limits import NumberOption


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices


ACTIONS = [(name, action) for name, parser in commands().items() for action in parser._actions]
NUMBERS = [pytest.param(name, action, id=f"{name} {action.option_strings[0]}") for name, action in ACTIONS
           if isinstance(action.type, NumberOption)]


def out_of_range(option: NumberOption) -> list[str]:
    """Values just outside ``option``'s range, and what is never a number of its kind."""
    allowed, step = option.allowed, 1 if option.kind is int else 0.5
    values = [allowed.low if allowed.low_open else allowed.low - step,
              allowed.high if allowed.high_open else allowed.high + step]
    return [str(int(v) if option.kind is int else v) for v in values] + (
        ["nan", "inf", "-inf"] if option.kind is float else ["1.5", "1e3"]) + ["many"]


def test_no_number_option_goes_undeclared():
    undeclared = [f"{name} {'/'.join(action.option_strings) or action.dest}" for name, action in ACTIONS
                  if action.type in (int, float)]
    assert not undeclared, f"declare their range with type=number(...): {undeclared}"
    assert len(NUMBERS) >= 20


@pytest.mark.parametrize("command, action", NUMBERS)
def test_every_number_option_refuses_what_it_does_not_declare(command, action, capsys):
    option, flag = action.type, action.option_strings[0]
    allowed = option.allowed
    assert None not in (allowed.low, allowed.high) and math.isfinite(allowed.high), f"{flag} declares both bounds"
    defaults = action.default if isinstance(action.default, list) else [action.default]
    assert all(allowed.holds(value) for value in defaults if value is not None), f"{flag}'s default is outside"
    for bound, open_ in ((allowed.low, allowed.low_open), (allowed.high, allowed.high_open)):
        if not open_:
            assert option(str(bound)) == bound
    for bad in out_of_range(option):
        assert main([command, f"{flag}={bad}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: runner.py {command}: argument {flag}: ") and err.count("\n") == 1, err
        assert f"must be {option.described()}, not {bad}" in err or f"invalid {option.kind.__name__} value" in err


def test_a_resample_count_beyond_memory_is_refused_before_any_record_is_read(tmp_path, capsys):
    """`compare --resamples 1000000000000` asked numpy for 291 TiB on the zoo's records (a traceback)."""
    assert main(["compare", str(tmp_path / "absent"), "a", "b", "--resamples", "1000000000000"]) == 2
    assert capsys.readouterr().err == ("error: runner.py compare: argument --resamples: must be a whole number from 2 "
                                       "to 100000, not 1000000000000 (see runner.py compare --help)\n")
