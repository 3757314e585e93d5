"""Settings and config files (cl2r_bench/settings.py, cl2r_bench/config.py): every bad setting, path or file is one
line before anything runs; numbers and YAML aliases read safely."""
import pytest
import yaml

from cl2r_bench.app import cli as runner
from cl2r_bench.errors import ConfigError
from cl2r_bench.training_settings import TrainSettings


def run_cli(*args):
    return runner.main([str(a) for a in args])


@pytest.mark.parametrize("setting, fragment", [
    ("evaluation.tie_rule=loose", "evaluation.tie_rule = 'loose'; choose from ['strict', 'inclusive']"),
    ("evaluation.mode=pixels", "evaluation.mode = 'pixels'"),
    ("evaluation.dataset=imagenet", "evaluation.dataset = 'imagenet'; choose from ['heldout', 'stream', 'cifar10'"),
    ("model.backbone=vit", "model.backbone = 'vit'"),
    ("device=gpu", "device = 'gpu'"),
    ("evaluation.confidence=1.5", "evaluation.confidence = 1.5 must be between 0 and 1"),
    ("evaluation.resamples=100001", "evaluation.resamples = 100001 must be from 1 to 100000"),
    ("training.batch_size=0", "training.batch_size = 0 must be from 1 to 2147483647"),
    ("training.lr=0", "training.lr = 0.0 must be above 0"),
    ("training.compile=fast", "training.compile must be false, true or one of ['default', 'reduce-overhead'"),
    ("training.lr=-1e-3", "training.lr = -0.001 must be above 0"),
    ("training.epochs=-2", "training.epochs = -2 must be from 1 to 2147483647"),
    ("stream.num_tasks=0", "stream.num_tasks = 0 must be from 1 to 2147483647"),
    ("model_update.queries=2147483648", "model_update.queries = 2147483648 must be from 1 to 2147483647"),
    ("stream.class_order=[3,3,1]", "stream.class_order = [3, 3, 1]"),
    ("stream.class_order=[a,b]", "stream.class_order = ['a', 'b']"),
    ("replacement.tasks=[0,5]", "replacement.tasks = [0, 5] must list distinct task numbers in 0..2"),
    ("replacement.tasks=[x]", "replacement.tasks = ['x']"),
    ("replacement.pretrain.class_counts=[3]", "one positive class count per replacement task (2)"),
    ("stream.num_tasks=9", "the stream needs 36 classes (4 + 4 x 8) + 6 held out; synthetic has 24; e.g. "
                           "--set stream.num_tasks=4"),
    ("training.lr_min=0.5", "training.lr_min = 0.5 is above training.lr"),
    ("adapter.at=sometimes", "adapter.at = 'sometimes'"),
    ("data.verify=maybe", "data.verify = 'maybe'"),
])
def test_every_bad_setting_is_one_line_before_anything_runs(setting, fragment, tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "iamcl2r", "--strategy", "er", "--output", out,
                   "--set", setting) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_scientific_notation_is_a_float_in_files_and_on_the_command_line(tmp_path):
    from cl2r_bench.config import resolve

    config = resolve([("file", yaml.safe_load("training: {lr: 1e-3, lr_min: 5E-6}")),
                      ("command line", {"replacement": {"pretrain": {"lr": "2.5e-2"}}})])
    assert (config["training"]["lr"], config["training"]["lr_min"]) == (0.001, 5e-6)
    assert config["replacement"]["pretrain"]["lr"] == 0.025


def bad_paths(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "latin1.yaml").write_bytes(b"\xff\xfeseed: 1")
    return [(["--output", str(afile / "sub")], "is a file, not a folder"),
            (["--output", str(afile)], "is a file, not a folder"),
            (["--output", ""], "output is empty"),
            (["--set", f"replacement.pretrain.cache_dir={afile / 'c'}"], "replacement.pretrain.cache_dir"),
            (["--set", f"model_update.feature_cache={afile}"], "model_update.feature_cache"),
            (["--config", str(tmp_path / "latin1.yaml")], "is not UTF-8 text (byte 0xff at position 0)"),
            (["--epochs", "abc"], "argument --epochs: invalid int value: 'abc'"),
            (["--set", "model_update.screen=true"], "a run ranks in memory: leave it false here"),
            (["--set", "model_update.unseen_classes=0.5"], "picks its classes with the stream settings"),
            (["--set", "model_update.unseen_classes=1.5"], "must be a share in [0, 1)"),
            (["--set", "model_update.pairing=unpaired"], "a stream fits on its own pairs: leave it paired here"),
            (["--set", "model_update.pairing=none"], "model_update.pairing")]


def test_bad_paths_files_and_values_are_one_line_before_anything_runs(tmp_path, capsys):
    """Output folders below a file, an empty output, a config file that is not UTF-8 and a value of the
    wrong type are one line and exit 2, and nothing is written."""
    from cl2r_bench.app.cli import main

    for args, message in bad_paths(tmp_path):
        try:
            code = main(["--dataset", "synthetic", *args])
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "latin1.yaml"]


def test_yaml_aliases_are_refused_in_config_files_and_set_values(tmp_path, capsys):
    """Nested aliases ("billion laughs") expand a few hundred bytes into gigabytes; settings never need
    them, so any alias is one line, exit 2."""
    from cl2r_bench.app.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n')
    assert main(["--dataset", "synthetic", "--config", str(bomb), "--output", str(tmp_path / "o")]) == 2
    assert "YAML aliases (*name) are not accepted in settings (line 2)" in capsys.readouterr().err
    assert main(["--dataset", "synthetic", "--set", "replacement.tasks=[&a 0, *a]", "--output", str(tmp_path)]) == 2
    assert "YAML aliases" in capsys.readouterr().err


@pytest.mark.parametrize("value, mode", [(False, None), (True, "default"), ("reduce-overhead", "reduce-overhead")])
def test_training_compile_is_off_on_or_a_torch_compile_mode_passed_to_the_forward_and_teacher(value, mode,
                                                                                              monkeypatch):
    import torch

    from cl2r_bench.training.engine import teacher_forward, training_forward

    settings = TrainSettings.with_defaults(compile=value)
    assert settings.compile_mode == mode
    monkeypatch.setattr(torch, "compile", lambda module, mode: ("compiled", module, mode))
    model = torch.nn.Linear(2, 2)
    expected = model if mode is None else ("compiled", model, mode)
    assert training_forward(model, settings) == expected and teacher_forward(model, settings) == expected
    with pytest.raises(ConfigError, match="training.compile must be false, true or one of .*'reduce-overhead'"):
        TrainSettings.with_defaults(compile="fast")


def test_a_config_file_holds_training_compile_as_a_bool_or_a_mode():
    """A run's saved config.yaml is read back through the same check: false, true and a mode all pass."""
    from cl2r_bench.config import merge

    base = {"training": {"compile": False}}
    for value in (False, True, "reduce-overhead"):
        assert merge(base, {"training": {"compile": value}}, "saved")["training"]["compile"] == value
    with pytest.raises(ConfigError, match=r"saved: training.compile = 3 has type int; expected bool or str"):
        merge(base, {"training": {"compile": 3}}, "saved")
