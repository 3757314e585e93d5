"""The command line (cl2r_bench/app/cli.py): what a misnamed plugin or an empty pretrain says."""



def test_a_plugin_folder_and_an_empty_pretrain_say_what_they_are(tmp_path, capsys):
    """`--plugin DIR.py` names a folder, and `pretrain` on a scenario without starting models says so."""
    from cl2r_bench.app.cli import main

    (tmp_path / "dir.py").mkdir()
    assert main(["--dataset", "synthetic", "--plugin", str(tmp_path / "dir.py"), "--output", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["pretrain", "--scenario", "cl2r", "--dataset", "synthetic"]) == 0
    assert "nothing to pretrain" in capsys.readouterr().out
