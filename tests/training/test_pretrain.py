"""Replacement-model pretraining (cl2r_bench/training/pretrain.py): damaged progress files, one pretraining at a
time per model, a cache entry per data."""
import socket
import subprocess
import sys
import time

import pytest
import torch
from helpers.data_files import write_tiny_imagenet

from cl2r_bench.data.datasets import DataError
from cl2r_bench.files import exclusive


def test_a_damaged_plateau_progress_file_or_image_cache_is_one_line(tmp_path):

    from cl2r_bench.data.tiny_imagenet import read_tiny_imagenet
    from cl2r_bench.models import CheckpointError, build_model
    from cl2r_bench.training.pretrain import PlateauTraining
    from cl2r_bench.training_settings import PlateauSettings, TrainSettings

    partial = tmp_path / "model.partial.pt"
    partial.write_bytes(b"PK\x03\x04 truncated")
    model = build_model(head="learnable", num_classes=3, backbone="small_cnn", small_width=4, small_out_dim=8)
    with pytest.raises(CheckpointError, match="model.partial.pt is damaged .*delete it"):
        PlateauTraining(model, None, PlateauSettings.with_defaults(), TrainSettings.with_defaults(), partial)
    folder = write_tiny_imagenet(tmp_path)
    (folder / "cl2r-cache-32px.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match="cl2r-cache-32px.npz is damaged .*delete it"):
        read_tiny_imagenet(tmp_path)


def test_a_second_pretraining_of_the_same_model_waits_for_the_first(tmp_path):
    lock = tmp_path / "model.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; from cl2r_bench.files import exclusive\n"
                               f"with exclusive({str(lock)!r}, 'x'):\n    print('held', flush=True); time.sleep(1.5)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    said, started = [], time.monotonic()
    with exclusive(lock, "the pretraining of model.pt", wait=said.append):
        assert time.monotonic() - started > 1.0  # entered only after the holder let go
    holder.wait()
    assert said == [f"waiting for pid {holder.pid} on host {socket.gethostname()}, which holds the pretraining of "
                    f"model.pt; if that process is gone, delete {lock} (a lock without a heartbeat for 60 s is taken "
                    "over by itself)"]


@pytest.mark.parametrize("change", [{"train_per_class": 6}, {"test_per_class": 3}, {"image_size": 20},
                                    {"num_classes": 9}, {"noise": 0.2}, {"similarity": 0.5}])
def test_a_pretrained_model_is_cached_per_data_so_no_data_setting_is_served_anothers_model(tmp_path, change):
    """Every setting that changes the data a replacement model is trained (or validated) on changes its
    cache key: the key holds the data's digest, not only the data set's name."""
    from cl2r_bench.data.synthetic import make_synthetic
    from cl2r_bench.training.pretrain import pretrained_replacement
    from cl2r_bench.training_settings import TrainSettings

    base = {"num_classes": 8, "train_per_class": 4, "test_per_class": 2, "image_size": 16}
    settings = TrainSettings.with_defaults(epochs=1, batch_size=16, progress=False)
    kwargs = {"backbone": "small_cnn", "simplex_vertices_count": 16, "small_width": 4, "small_out_dim": 8}

    def path(data):
        return pretrained_replacement(data, [0, 1, 2], head="learnable", model_kwargs=kwargs, settings=settings,
                                      images_per_class=None, device=torch.device("cpu"), seed=0,
                                      cache_dir=tmp_path, log=lambda _: None)

    first, _ = path(make_synthetic(**base))
    again, cached = path(make_synthetic(**base))
    other, other_cached = path(make_synthetic(**{**base, **change}))
    assert again == first and cached
    assert other != first and not other_cached


def test_speed_options_share_a_replacement_models_cache_key_and_training_settings_do_not(tmp_path):
    """``cl2r_bench.config.SPEED_OPTIONS`` train the same model, so one cached checkpoint serves every value of
    them; a setting of what is trained (the learning rate) gets its own."""
    from cl2r_bench.data.synthetic import make_synthetic
    from cl2r_bench.training.pretrain import pretrained_replacement
    from cl2r_bench.training_settings import TrainSettings

    data = make_synthetic(num_classes=8, train_per_class=4, test_per_class=2, image_size=16)
    kwargs = {"backbone": "small_cnn", "simplex_vertices_count": 16, "small_width": 4, "small_out_dim": 8}

    def path(**training):
        settings = TrainSettings.with_defaults(epochs=1, batch_size=16, progress=False, **training)
        return pretrained_replacement(data, [0, 1, 2], head="learnable", model_kwargs=kwargs, settings=settings,
                                      images_per_class=None, device=torch.device("cpu"), seed=0,
                                      cache_dir=tmp_path, log=lambda _: None)

    first, _ = path(fused_optimizer=True)
    assert path(fused_optimizer=False, channels_last=True, compile="reduce-overhead") == (first, True)
    other, cached = path(lr=0.5)
    assert other != first and not cached


def test_plateau_pretraining_through_a_compiled_forward_keeps_the_models_own_state(tmp_path, monkeypatch):
    """``training.compile`` wraps the training forward (``torch.compile``'s ``_orig_mod.`` keys, as DDP's
    ``module.``); the plateau hook must still save and restore the model's own state dict. Found on an H200: the
    fidelity preset's pretraining with ``training.compile=reduce-overhead`` crashed after its last epoch."""
    import cl2r_bench.training.loop as loop
    from cl2r_bench.data.synthetic import make_synthetic
    from cl2r_bench.training.pretrain import pretrain_model
    from cl2r_bench.training_settings import PlateauSettings, TrainSettings

    wrapped = []
    monkeypatch.setattr(loop, "training_forward",
                        lambda model, settings, processes=None: wrapped.append(1) or torch.compile(model,
                                                                                                backend="eager"))
    data = make_synthetic(num_classes=4, train_per_class=8, test_per_class=2, image_size=16)
    partial = tmp_path / "model.partial.pt"
    model, log = pretrain_model(data, [0, 1, 2], head="learnable", settings=TrainSettings.with_defaults(
        epochs=2, batch_size=8, progress=False), model_kwargs={"backbone": "small_cnn", "small_width": 4,
                                                               "small_out_dim": 8},
        images_per_class=None, device=torch.device("cpu"), seed=0, partial=partial,
        plateau=PlateauSettings.with_defaults(), log=lambda _: None)
    assert wrapped and log["epochs_done"] == 2
    saved = torch.load(partial, weights_only=True)
    assert set(saved["model"]) == set(saved["best_model"]) == set(model.state_dict())
