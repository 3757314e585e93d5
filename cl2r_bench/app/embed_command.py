"""``runner.py embed``: a study's or a track run's splits embedded into the feature cache, in this process's shards
or as a SLURM array (:mod:`cl2r_bench.app.embedding`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from cl2r_bench.errors import UsageError, writable_folder


def command_embed(args: argparse.Namespace) -> int:
    """Embed the asked study's or track run's splits into the feature cache as this process's shards
    (:mod:`cl2r_bench.app.embedding`), or, with ``--launcher slurm``, as a job array followed to its end, then join
    what the tasks left."""
    from cl2r_bench.app.embedding import embed_study, mark_done, slurm_workers, this_worker
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.feature_cache import Sharding

    sharding = this_worker(args)
    runs = requested_runs(args)
    if len(runs) != 1 or not (runs[0].scenario.measures_features() or runs[0].settings.model.on_encoders):
        raise UsageError("runner.py embed embeds one model-update study of two encoders (--scenario model_update --set "
                         "model_update.old=SPEC --set model_update.new=SPEC) or the data of one run on frozen "
                         "encoders (--preset pretrained): one seed, one strategy or adapter")
    parts = runs[0]
    if args.launcher == "slurm" and args.worker is None:
        from cl2r_bench.app.slurm import check_cluster, run_slurm

        check_cluster(args)
        folder = Path(parts.settings.model_update.feature_cache) / "slurm"
        writable_folder(folder, "the feature cache's SLURM folder")
        code = run_slurm(slurm_workers(parts, args, folder), args, folder)
        if code != 0:
            print("embed: some array tasks failed; their shards are embedded here instead")
        sharding = Sharding(args.shards)
    embed_study(parts, sharding)
    mark_done(args.done_file)
    return 0
