"""The adapter papers' protocol on encoder specs (`model_update.old` / `new`, docs/METHODS.md §7b): each split
embedded once for every adapter, specs checked before any data is read, and the papers' command with --download
on the libraries' own download paths."""
import json

import pytest
import torch
from helpers.adapter_pairs import few_steps_options
from helpers.data_files import write_cifar100

from cl2r_bench.app.cli import main


@pytest.mark.slow
def test_model_update_on_two_encoders_embeds_each_split_once_for_every_adapter(encoder_files, tmp_path, capsys):
    old, new = encoder_files
    cache, out = tmp_path / "features", tmp_path / "results"
    common = ["--scenario", "model_update", "--dataset", "synthetic", "--device", "cpu", "--no-progress",
              "--output", str(out), "--set", "data.synthetic_classes=5", "--set", "data.synthetic_train_per_class=8",
              "--set", "data.synthetic_test_per_class=4", "--set", f"model_update.old={old}",
              "--set", f"model_update.new={new}", "--set", f"model_update.feature_cache={cache}",
              "--set", "model_update.backfill_steps=2", *few_steps_options()]
    from cl2r_bench.adapters import list_adapters
    assert main([*common, "--adapter", "all"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("embedded in") == 4 and printed.count("(cached)") == 4 * len(list_adapters())
    records = [json.loads(p.read_text()) for p in sorted(out.rglob("metrics.json"))]

    assert {r["method"] for r in records} == {"none", *list_adapters()}
    by_name = {r["method"]: r for r in records}
    cases = by_name["lambda_orth"]["retrieval"]["cases"]
    assert cases["B/old"] is not None and cases["new/F"] is None and cases["F/old"] is not None
    assert by_name["none"]["retrieval"]["cases"]["new/old"] is None
    assert (by_name["none"]["models"]["old"]["feature_dim"] == 256
            and by_name["none"]["models"]["new"]["feature_dim"] == 96)
    assert (by_name["procrustes"]["retrieval"]["queries"] == 20
            and by_name["procrustes"]["retrieval"]["fitting_items"] == 40)
    assert len(list(cache.glob("*.pt"))) == 4
    procrustes = next(out.rglob("procrustes/seed*/metrics.json"))
    written = procrustes.read_bytes()
    assert main([*common, "--adapter", "procrustes", "--resume"]) == 0
    assert "complete already" in capsys.readouterr().out and procrustes.read_bytes() == written
    assert main(["leaderboard", "--results", str(out), "--table", "backfilling", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2 + len(list_adapters())
    assert by_name["none"]["models"]["test_classes"] == by_name["none"]["models"]["test_classes_fitted"] == 5
    open_set = tmp_path / "open"
    elsewhere = [str(open_set) if arg == str(out) else arg for arg in common]
    assert main([*elsewhere, "--adapter", "procrustes", "--set", "model_update.unseen_classes=0.4"]) == 0
    assert "embedded in" not in capsys.readouterr().out, "the open set reuses the cached features"
    (record,) = [json.loads(p.read_text()) for p in open_set.rglob("metrics.json")]
    about, retrieval = record["models"], record["retrieval"]
    assert (about["unseen_classes_drawn"], about["test_classes"], about["test_classes_fitted"]) == (2, 2, 0)
    assert retrieval["queries"] == 2 * 4 and retrieval["fitting_items"] == 3 * 8


def test_encoder_specs_are_checked_before_any_data_is_read(tmp_path, capsys):
    code = main(["--scenario", "model_update", "--dataset", "cifar10", "--data-root", str(tmp_path / "none"),
                 "--set", "model_update.old=timm:no_such_net", "--set", "model_update.new=timm:resnet18",
                 "--output", str(tmp_path / "o")])
    assert code == 2 and "timm has no model 'no_such_net'" in capsys.readouterr().err
    code = main(["--scenario", "model_update", "--set", "model_update.old=timm:resnet18", "--output", str(tmp_path)])
    assert code == 2 and "give both model_update.old and model_update.new" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_papers_command_with_download_runs_on_the_libraries_own_download_paths(tmp_path, monkeypatch, capsys):
    """README's command for a user with internet (torchvision encoders, CIFAR-100 with --download), offline: the
    data set comes through torchvision's downloader from an HTTP server on this machine's loopback (its downloader
    reads HTTP only) and the weights from torch.hub's cache, as a first run leaves them; only the internet is
    missing. The pair (MNASNet 0.5 -> MobileNet V3 small, 1280-d -> 1024-d) is smaller than ResNet-18 -> ViT-L/16
    (whose random weights alone are 1.2 GB) but takes the same path."""
    import functools
    import hashlib
    import http.server
    import tarfile
    import threading

    import torchvision

    from cl2r_bench.data import cifar

    source = tmp_path / "source"
    write_cifar100(source, per_class_train=2, per_class_test=2)
    archive = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "cifar-100-python", arcname="cifar-100-python")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{archive.name}"
    official = cifar.CIFAR_RELEASES["cifar100"]
    monkeypatch.setitem(cifar.CIFAR_RELEASES, "cifar100", {**official, "url": url,
                                                      "archive_md5": hashlib.md5(archive.read_bytes()).hexdigest()})
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    for name, weights in (("mnasnet0_5", "MNASNet0_5_Weights"), ("mobilenet_v3_small", "MobileNet_V3_Small_Weights")):
        file_name = torchvision.models.get_weight(f"{weights}.IMAGENET1K_V1").url.rpartition("/")[2]
        torch.save(torchvision.models.get_model(name).state_dict(), cache / file_name)
    code = main(["--scenario", "model_update", "--dataset", "cifar100", "--download", "--data-root",
                 str(tmp_path / "data"), "--set", "model_update.old=torchvision:mnasnet0_5:IMAGENET1K_V1",
                 "--set", "model_update.new=torchvision:mobilenet_v3_small:IMAGENET1K_V1", "--adapter", "procrustes",
                 "--set", "model_update.fit_per_class=1", "--set", "model_update.test_per_class=2", "--device", "cpu",
                 "--no-progress", "--output", str(tmp_path / "out"),
                 "--set", f"model_update.feature_cache={tmp_path / 'features'}"])
    server.shutdown()
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "data" / "cifar-100-python" / "train").is_file()
    record = json.loads(next((tmp_path / "out").rglob("metrics.json")).read_text())
    assert record["models"]["old"]["feature_dim"] == 1280 and record["models"]["new"]["feature_dim"] == 1024
    assert record["retrieval"]["queries"] == 200 and record["retrieval"]["cases"]["B/old"] is not None
