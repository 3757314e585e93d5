"""The adapter a study fitted, exported for production (`runner.py adapt --export`, docs/METHODS.md §7b): every
exported map gives the adapter's own features and loads with torch alone; an export folder that cannot take it
is refused first."""
import subprocess
import sys

import torch
from helpers.adapt_inputs import adapt

EVERY_MAP = """
import sys, warnings
import torch
import yaml
warnings.simplefilter("error")                      # loading must not warn (TorchScript's deprecation did)
features = sys.argv[1]
x = torch.load(features, weights_only=True)
out = {}
for export in sys.argv[2:]:
    out[export] = {}
    for name in ("backward", "old_frame", "forward", "dual_query"):
        try:
            program = torch.export.load(f"{export}/{name}.pt2")
        except FileNotFoundError:
            continue
        out[export][name] = program.module()(*x[name])
torch.save(out, features + ".out")
assert not [m for m in sys.modules if m.split(".")[0] in ("cl2r_bench", "benchmarks", "strategies", "scenarios")]
"""
EXPORTED = ("lambda_orth", "fct", "fastfill", "irp", "procrustes", "least_squares", "affine", "latent_translation",
            "slerp")


def test_every_exported_map_gives_the_adapters_features_and_loads_with_torch_alone(tmp_path):
    """Each adapter fitted on 16-d old and 24-d new features, exported, then loaded in one fresh Python that imports
    torch alone and never the suite; each one's maps give the in-process adapter's normalised features."""
    from cl2r_bench.adapter_study import export_adapter
    from cl2r_bench.adapters import FeaturePair, fit_adapter, make_adapter

    torch.manual_seed(0)
    old, new = (torch.nn.functional.normalize(torch.randn(200, d), dim=1) for d in (16, 24))
    inputs = {"backward": (new[:7],), "old_frame": (old[:7],), "forward": (old[:7],), "dual_query": (old[:7], new[:7])}
    torch.save(inputs, tmp_path / "x.pt")
    adapters = {}
    for name in EXPORTED:
        adapter = make_adapter(name, {name: {"max_steps": 3}} if name in ("lambda_orth", "fct", "fastfill") else {})
        fit_adapter(adapter, FeaturePair(old, new, torch.arange(200) % 5,
                                         new_classifier=torch.nn.functional.normalize(torch.randn(5, 24), dim=1)), 0)
        export_adapter(adapter, tmp_path / name)
        adapters[str(tmp_path / name)] = adapter
    subprocess.run([sys.executable, "-c", EVERY_MAP, str(tmp_path / "x.pt"), *adapters], check=True, cwd=tmp_path)
    loaded = torch.load(tmp_path / "x.pt.out", weights_only=True)
    for export, adapter in adapters.items():
        got = loaded[export]
        expected_maps = {"backward", "old_frame"} if "backward" in adapter.directions else set()
        expected_maps |= {"dual_query", "old_frame"} if "dual" in adapter.directions else set()
        assert set(got) == expected_maps | ({"forward"} if "forward" in adapter.directions else set()), export
        with torch.no_grad():
            for which, features in got.items():
                expected = torch.nn.functional.normalize(getattr(adapter, which)(*inputs[which]), dim=1)
                torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6, msg=f"{export} {which}")


def test_an_export_folder_that_cannot_take_it_is_refused_first_and_links_are_replaced_not_followed(rotated,
                                                                                                   tmp_path, capsys):
    train, test = rotated
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "procrustes").write_text("a file where the adapter's folder goes")
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path / "a",
                      "--export", blocked, capsys=capsys)
    assert code == 2 and "procrustes is a file" in out.err and "Traceback" not in out.err, out.err
    assert not (tmp_path / "a").exists(), "refused before the study"
    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"not the suite's to overwrite")
    exported = tmp_path / "exported" / "procrustes"
    exported.mkdir(parents=True)
    (exported / "adapter_state.pt").symlink_to(outside)
    assert adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path / "b",
                 "--export", tmp_path / "exported", capsys=capsys)[0] == 0
    assert outside.read_bytes() == b"not the suite's to overwrite"
    assert not (exported / "adapter_state.pt").is_symlink() and torch.load(exported / "adapter_state.pt")
