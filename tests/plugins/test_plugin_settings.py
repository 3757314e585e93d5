"""Settings checked by construction (cl2r_bench/plugin_settings.py): every registered strategy's, adapter's and
scenario's every setting is fed a value outside what it declares, and every encoder family an unknown model, through
the path a user's --set takes; each is refused in one line naming the setting, its value and what is allowed. A new
plug-in is covered here without a new test."""
from dataclasses import fields

import pytest

from cl2r_bench.adapters import AdapterError, get_adapter, list_adapters
from cl2r_bench.encoders import ENCODER_FAMILIES, EncoderError, check_spec
from cl2r_bench.limits import COUNT_MAX
from cl2r_bench.plugin_settings import allowed, config_from_params, setting_types
from scenarios import get_scenario, list_scenarios
from strategies import StrategyError, get_strategy, list_strategies

PLUGINS = ([("strategy_params", name, get_strategy(name), StrategyError) for name in list_strategies()]
           + [("adapter_params", name, get_adapter(name), AdapterError) for name in list_adapters()]
           + [("scenario_params", name, get_scenario(name), ValueError) for name in list_scenarios()])
SETTINGS = [pytest.param(section, name, cls, error, item, id=f"{section}.{name}.{item.name}")
            for section, name, cls, error in PLUGINS for item in fields(cls.Config)]


def out_of_range(rule, kinds) -> list:
    """Values just outside ``rule`` (a Python int for a count, so the message shows it as given)."""
    if rule.choices is not None:
        return ["no_such_choice"]
    step = 1 if int in kinds else 0.5
    values = [] if rule.low is None else [rule.low if rule.low_open else rule.low - step]
    values += [] if rule.high is None else [rule.high if rule.high_open else rule.high + step]
    values += [float("nan")] if float in kinds else []
    return [int(v) if int in kinds and v == int(v) else v for v in values]


@pytest.mark.parametrize("section, name, cls, error, item", SETTINGS)
def test_every_setting_refuses_what_it_does_not_declare(section, name, cls, error, item):
    kinds = setting_types(cls.Config, item.name)
    if bool in kinds:
        with pytest.raises(error, match=rf"^{section}\.{name}\.{item.name} = 1: expected bool"):
            config_from_params(cls.Config, {item.name: 1}, f"{section}.{name}", error)
        return
    rule = allowed(cls.Config, item)
    assert str not in kinds or rule.choices is not None, f"{item.name}: a string setting declares its choices"
    assert rule.problem(item.default) is None, f"{item.name}'s default {item.default!r} is outside its own rule"
    bad_values = out_of_range(rule, kinds)
    assert bad_values, f"{item.name} declares no bound"
    for bad in bad_values:
        with pytest.raises(error) as refused:
            config_from_params(cls.Config, {item.name: bad}, f"{section}.{name}", error)
        message = str(refused.value)
        assert message.startswith(f"{section}.{name}.{item.name} = {bad!r}") and "\n" not in message
        assert ("choose from" if rule.choices else "must be") in message


def test_counts_stop_at_the_command_lines_ceiling_and_widths_below_memory():
    drift = get_adapter("drift_adapter").Config
    rank = next(item for item in fields(drift) if item.name == "rank")
    anchors = next(item for item in fields(drift) if item.name == "anchors")
    assert allowed(drift, rank).high == 16384 and allowed(drift, anchors).high == COUNT_MAX
    with pytest.raises(AdapterError, match=r"rank = 1000000000 must be at least 1 and at most 16384$"):
        config_from_params(drift, {"rank": 10**9}, "adapter_params.drift_adapter", AdapterError)


@pytest.mark.parametrize("family", sorted(ENCODER_FAMILIES.classes))
def test_every_encoder_family_refuses_an_unknown_model_in_one_line(family):
    with pytest.raises(EncoderError) as refused:
        check_spec(f"{family}:no_such_model_v9")
    assert "\n" not in str(refused.value) and str(refused.value)
