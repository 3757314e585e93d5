"""BCT, UniBCT and AdvBCT on the track, by ``Ashespt/AdvBCT`` (AdvBCT's authors; neither BCT's nor UniBCT's own code
is released, their ``COMP_LOSS.TYPE: bct`` and ``uni_bct`` are the reimplementations the suite's recipes read),
driven by ``track_reference.py``.

Two of their entry points run, as their scripts do: ``extract_feat.py``'s ``main`` on the old model over the old
classes' training items, then its ``gen_class_meta`` and ``gen_class_theta`` (the class centres and radii AdvBCT's
elastic boundary reads; ``scripts/extract_feat.sh`` names ``configs/extract_feat.yml``, which the repository
lacks, so their defaults with the old model's fields set stand for it; UniBCT reads the same file's class centres
as its prototypes); then ``train.py``'s ``main`` with ``configs/new_BCT.yml``, ``configs/new_uniBCT.yml`` or
``configs/new_AdvBct.yml`` (SGD 0.1, momentum 0.9, weight decay 5e-4 on every
parameter, ``MultiStepLR`` [5, 10, 20] x 0.1, 30 epochs), which builds their models (``build_bct_models``) and
``LandmarkComTrainer`` and trains. Around them: timm's backbone is the suite's embedding network, and
``CreateBaseModel``'s projection and batch norm are the identity (the network ends at the feature, as in the step
check, ``bct_probe.py``), the old model loading its weights and classifier from a checkpoint in their format
through their own ``load_state``; the track's items are a data set of theirs (``factory_train_landmark_dataset``),
so their ``build_train_dataloader`` makes the loaders (``DistributedSampler``, seed 0 as released, the suite's
batch of 128); their process group is one gloo process, ``DistributedDataParallel`` the module itself. Their
trainer's evaluation (``evaluate_func`` on rOxford / rParis before training and after every epoch) is not run: the
suite's protocol scores the model their last epoch saves.

As released, ``train.py`` stops at its imports: it imports ``build_reid_dataloader`` from ``data_loaders``, which
does not define it (only its re-identification branch calls it); a stand-in that raises is put there. Its ``main``
spawns one ``main_worker`` per GPU; here one, in this process (``TrackRun.spawned``).
"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

REPOSITORY = "Ashespt/AdvBCT"
MARKER = "trainer/trainer.py"
STRATEGIES = ("bct", "unibct", "advbct")
CONFIGS = {"bct": "configs/new_BCT.yml", "unibct": "configs/new_uniBCT.yml", "advbct": "configs/new_AdvBct.yml"}
ENTRY_POINT = ("extract_feat.py main() L12, gen_class_meta() L40, gen_class_theta() L90 on the old model; then "
               "train.py main() L20 (one main_worker L38, LandmarkComTrainer.train trainer/trainer.py L245) with "
               "configs/new_BCT.yml (bct), configs/new_uniBCT.yml (unibct) or configs/new_AdvBct.yml (advbct)")
ARCH = "track_embedding"


def configured(run, path: str | None, **fields):
    """Their configuration (their defaults, merged with the file ``path`` by ``get_config``), then ``fields``
    (dotted names), left unfrozen as their ``__main__`` hands it on."""
    from configs import get_config
    from configs.defaults import _C

    config = get_config(argparse.Namespace(cfg=str(run.checkout / path), opts=[])) if path else _C.clone()
    config.defrost()
    backend, url = run.process_group()
    settings = {"SEED": run.seed, "DEVICE": run.device.type, "DIST_BACKEND": backend, "DIST_URL": url,
                "WORLD_SIZE": 1, "MODEL.EMB_DIM": run.width, **fields}
    for dotted, value in settings.items():
        *sections, key = dotted.split(".")
        node = config
        for section in sections:
            node = getattr(node, section)
        setattr(node, key, value)
    return config


def featured_models(build, run):
    """``build_bct_models`` whose ``CreateBaseModel``s end at the backbone's feature (module docstring), after
    checking that the first model (the old one) holds the old model's weights and classifier."""
    def models(*args, **kwargs):
        built = build(*args, **kwargs)
        models = [model for model in built if model is not None]
        loaded = {f"network.{k}": v for k, v in run.data["old"]["backbone"].items()}
        state = models[0].state_dict()
        if not (all(torch.equal(state[f"convnet.{k}"].cpu(), v) for k, v in loaded.items())
                and torch.equal(state["projection_cls.weight"].cpu(), run.old_classifier)):
            raise RuntimeError("their load_state did not give the old model its weights")
        for model in models:
            model.projection_dim, model.bn = nn.Identity(), nn.Identity()
        return built
    return models


def networks(*made) -> None:
    """timm's ``list_models`` and ``create_model`` giving the networks ``made`` in turn."""
    import timm

    queue = list(made)
    timm.list_models = lambda *args, **kwargs: [ARCH]
    timm.create_model = lambda *args, **kwargs: queue.pop(0)


def class_regions(run, old_checkpoint) -> str:
    """Their ``extract_feat.py`` on the old model's features of the old classes' items: the meta file of radii."""
    import extract_feat
    from data_loaders import factory_train_landmark_dataset

    old = run.train_labels < run.old_classes
    dataset = TensorDataset(run.train_items[old], run.train_labels[old])
    factory_train_landmark_dataset["track_old"] = lambda *args: dataset
    folder = run.work / "meta"
    config = configured(run, None, **{"TRAIN.DATASET": "track_old", "TRAIN.BATCH_SIZE": run.batch_size,
                                    "MODEL.ARCH": ARCH, "MODEL.PRETRAINED_PATH": str(old_checkpoint),
                                    "MODEL.NUM_CLASSES": run.old_classes, "EVAL.SAVE_DIR": str(folder)})
    networks(run.network(tuple(run.data["old"]["columns"])))
    extract_feat.build_bct_models = featured_models(extract_feat.build_bct_models, run)
    count = extract_feat.main(config)
    extract_feat.gen_class_meta(config, count)
    extract_feat.gen_class_theta(config, count)
    return str(folder / f"track_old_{count}_meta_radius_centernorm.json")


def unreleased_reid_loader(*args, **kwargs):
    raise RuntimeError("build_reid_dataloader is not in the released data_loaders (train.py's reid branch)")


def train(run, strategy: str):
    import data_loaders

    data_loaders.build_reid_dataloader = unreleased_reid_loader
    import train as advbct
    import trainer.trainer
    from data_loaders import factory_train_landmark_dataset

    old_checkpoint = run.work / "old_model.pth.tar"
    old = run.frozen_network("old")
    torch.save({"model": {**{f"convnet.{k}": v for k, v in old.state_dict().items()},
                          "projection_cls.weight": run.old_classifier}}, old_checkpoint)
    meta = class_regions(run, old_checkpoint)
    factory_train_landmark_dataset["track"] = lambda *args: TensorDataset(run.train_items, run.train_labels)
    epochs = run.epochs(configured(run, CONFIGS[strategy]).TRAIN.EPOCHS)
    config = configured(run, CONFIGS[strategy], **{
        "TRAIN.DATASET": "track", "TRAIN.BATCH_SIZE": run.batch_size, "TRAIN.EPOCHS": epochs,
        "OUTPUT": str(run.work / "train"), "OLD_MODEL.ARCH": ARCH, "NEW_MODEL.ARCH": ARCH,
        "OLD_MODEL.PRETRAINED_PATH": str(old_checkpoint), "NEW_MODEL.PRETRAINED": False,
        "OLD_MODEL.NUM_CLASSES": run.old_classes, "NEW_MODEL.NUM_CLASSES": run.classes,
        "MODEL.NUM_CLASSES": run.classes, "EVAL.OLD_SAVE_FILE": meta})
    networks(run.network(tuple(run.data["old"]["columns"])), run.new_network())
    advbct.build_bct_models = featured_models(advbct.build_bct_models, run)
    advbct.build_test_dataloader = lambda *args, **kwargs: ([], None)
    trainer.trainer.evaluate_func = lambda *args, **kwargs: 0.0
    run.spawned(advbct.main, config)
    saved = torch.load(run.work / "train" / "ckpt" / f"checkpoint_epoch{epochs}.pth.tar", map_location=run.device,
                       weights_only=False)["model"]
    network = run.new_network().to(run.device)
    network.load_state_dict({k.removeprefix("convnet."): v for k, v in saved.items() if k.startswith("convnet.")})
    return network.eval()
