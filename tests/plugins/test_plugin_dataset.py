"""A user's own data set, one file and its profile in a temporary folder and nothing else touched (docs/plugins.md):
the profile sits in ``configs/datasets/<name>.yaml`` beside the plug-in file, a run trains on the data set, and it
serves as an open evaluation set of another run."""
import json
import textwrap

import pytest
import yaml

import runner

PLUGIN = '''
from cl2r_bench.data.datasets import DataSet, register_dataset
from cl2r_bench.data.synthetic import make_synthetic


@register_dataset("layouts")
class Layouts(DataSet):
    """24 classes of generated colour layouts, another seed than the suite's synthetic data."""
    classes, native_size, mean, std = 24, None, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

    def load(self, root, *, download, image_size, verify, **options):
        return make_synthetic(num_classes=24, train_per_class=16, test_per_class=4, image_size=image_size, seed=7)
'''

PROFILE = {"stream": {"initial_classes": 6, "increment": 6, "num_tasks": 2, "images_per_class": 16},
           "evaluation": {"dataset": "heldout", "heldout_classes": 6},
           "replacement": {"pretrain": {"dataset": "layouts", "class_counts": [6]}}}
SMALL = ["--preset", "quick", "--device", "cpu", "--epochs", "1", "--no-progress", "--set", "model.small_width=8",
         "--set", "model.small_out_dim=16", "--set", "training.batch_size=32", "--set", "training.new_batch_size=16",
         "--set", "training.memory_batch_size=16", "--set", "evaluation.queries_per_class=null"]


@pytest.fixture
def plugin(tmp_path):
    folder = tmp_path / "elsewhere"
    (folder / "configs" / "datasets").mkdir(parents=True)
    (folder / "layouts.py").write_text(textwrap.dedent(PLUGIN))
    (folder / "configs" / "datasets" / "layouts.yaml").write_text("# Generated layouts.\n" + yaml.safe_dump(PROFILE))
    return folder / "layouts.py"


def test_a_plugin_data_set_with_its_profile_beside_it_trains_a_run(plugin, tmp_path):
    out = tmp_path / "out"
    assert runner.main(["--scenario", "cl2r", "--strategy", "er", "--dataset", "layouts", "--plugin", str(plugin),
                        "--output", str(out), *SMALL]) == 0
    folder = out / "cl2r" / "layouts" / "er" / "seed42"
    record = json.loads((folder / "metrics.json").read_text())
    assert record["complete"] and record["stream"]["classes_per_task"] == [6, 6]
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["stream"]["initial_classes"] == 6 and config["evaluation"]["heldout_classes"] == 6


def test_a_plugin_data_set_is_an_open_evaluation_set_of_another_run(plugin, tmp_path):
    out = tmp_path / "out"
    assert runner.main(["--scenario", "cl2r", "--strategy", "er", "--dataset", "synthetic", "--plugin", str(plugin),
                        "--output", str(out), "--set", "stream.num_tasks=2", "--set", "evaluation.dataset=layouts",
                        *SMALL]) == 0
    record = json.loads(next(out.rglob("metrics.json")).read_text())
    assert record["complete"] and record["evaluation"]["queries"] == 24 * 16


def test_a_plugin_data_set_without_its_profile_is_one_line_saying_where_it_goes(plugin, tmp_path, capsys):
    (plugin.parent / "configs" / "datasets" / "layouts.yaml").unlink()
    code = runner.main(["--scenario", "cl2r", "--dataset", "layouts", "--plugin", str(plugin), "--output",
                        str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown dataset 'layouts'" in err and err.strip().count("\n") == 0
    assert "configs/datasets/layouts.yaml beside the plug-in" in err
