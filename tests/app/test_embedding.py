"""``runner.py embed`` (cl2r_bench/app/embedding.py): a model-update study's splits embedded into the feature cache in
shards, by two torchrun ranks on the CPU and by a job array on the test SLURM cluster, then found cached by the
study itself."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.launching import CLUSTER, SMALL, torchrun

from cl2r_bench.app.cli import main

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study(encoder_files):
    """The settings of a small study on synthetic data: two random timm encoders (test_adapt's), 5 classes."""
    old, new = encoder_files
    return ["--scenario", "model_update", "--dataset", "synthetic", "--device", "cpu", "--no-progress",
            "--set", "data.synthetic_classes=5", "--set", "data.synthetic_train_per_class=8",
            "--set", "data.synthetic_test_per_class=4", "--set", f"model_update.old={old}",
            "--set", f"model_update.new={new}", "--set", "model_update.backfill_steps=2"]


def found_cached(study, cache, out, capsys):
    """The study run on the cache: every split of both encoders read from it, none embedded."""
    capsys.readouterr()
    assert main([*study, "--set", f"model_update.feature_cache={cache}", "--adapter", "procrustes",
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    return printed.count("(cached)") == 4 and "embedded in" not in printed


def test_two_torchrun_ranks_embed_the_shards_between_them_and_the_study_finds_them(study, tmp_path, capsys):
    """Each of the four splits (2 encoders x train / test) in 3 shards: every shard is embedded exactly once by one
    of the two ranks (a rank that takes part in a split says how many of its shards it embedded; which rank does
    how many depends on which starts first), and the study then embeds nothing."""

    cache = tmp_path / "features"
    done = torchrun(str(TESTS.parent / "runner.py"), "embed", *study, "--set", f"model_update.feature_cache={cache}",
                    "--shards", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(cache.glob("*.pt"))) == 4 and not list(cache.glob("*.shard-*")) and not list(cache.glob("*.lock"))
    embedded_here = [int(n) for n in re.findall(r"(\d) of 3 shards embedded here", done.stdout)]
    assert len(embedded_here) >= 4 and sum(embedded_here) == 4 * 3
    assert found_cached(study, cache, tmp_path / "out", capsys)


def test_embed_refuses_what_is_not_a_two_encoder_study_in_one_line(tmp_path, capsys):
    assert main(["embed", "--scenario", "cl2r", "--dataset", "synthetic", "--shards", "2"]) == 2
    assert "runner.py embed embeds one model-update study of two encoders" in capsys.readouterr().err
    for shards in ("0", "1000000000000"):
        assert main(["embed", "--scenario", "model_update", "--shards", shards]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_more_shards_than_images_is_one_line_before_anything_is_embedded(study, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["embed", *study, "--set", f"model_update.feature_cache={cache}", "--shards", "21"]) == 2
    err = capsys.readouterr().err
    assert "--shards 21 is more than the 20 images of the test split; give at most 20" in err, err
    assert not cache.exists() or not list(cache.glob("*.pt")), "nothing embedded"


@pytest.mark.slurm
def test_a_slurm_job_array_embeds_the_shards_and_the_study_finds_them(study, tmp_path, monkeypatch, capsys):

    pytest.importorskip("submitit")
    if shutil.which("sbatch") is None or not (CLUSTER.parent / "slurmctld.pid").exists():
        pytest.skip("the test SLURM cluster is not up: tests/slurm/cluster.sh start")
    monkeypatch.setenv("SLURM_CONF", str(CLUSTER))
    cache = tmp_path / "features"
    done = subprocess.run([sys.executable, "-m", "cl2r_bench", "embed", *study, "--set",
                           f"model_update.feature_cache={cache}", "--shards", "2", "--launcher", "slurm", *SMALL],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert len(list((cache / "slurm").glob("embed-worker-*.done"))) == 2
    assert len(list(cache.glob("*.pt"))) == 4 and not list(cache.glob("*.shard-*"))
    assert found_cached(study, cache, tmp_path / "out", capsys)
