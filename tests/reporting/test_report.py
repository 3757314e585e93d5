"""The HTML report: one self-contained page per results folder, its tables built by the leaderboard,
the published figures apart from the measured rows, and the page checked in a real browser (headless Chromium):
every row there, every image decoded, a column sorted by the page's own script, a screenshot saved."""
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.records import changed, retrieval_record, update_record, valid_record

from cl2r_bench.app import cli
from cl2r_bench.reporting.published import IAMCL2R_RELEASED
from cl2r_bench.reporting.report import write_report


def put(folder: Path, record: dict, config: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(record))
    if config:
        (folder / "config.yaml").write_text(yaml.safe_dump(record["config"]))
    return folder / "metrics.json"


@pytest.fixture
def results(tmp_path):
    """Two IAM-CL2R experiments (er: 2 seeds, AC 1; dsimplex_hoc: 1 seed, AC 0.25), a model_update run, a
    leave-one-out adapter study (with backfilling curves) and a damaged file."""
    root = tmp_path / "results"
    for seed in (1, 2):
        put(root / f"iamcl2r/synthetic/er/seed{seed}", valid_record(seed))
    hoc = changed(changed(changed(valid_record(1), "strategy", "dsimplex_hoc"), "method", "dsimplex_hoc"),
                  "config.strategy", "dsimplex_hoc")
    hoc["metrics"] = dict(hoc["metrics"], AC=0.25)
    put(root / "iamcl2r/synthetic/dsimplex_hoc/seed1", hoc)
    put(root / "model_update/synthetic/lambda_orth/seed1", update_record(), config=False)
    study = retrieval_record(1)
    study["retrieval"]["backfilling"]["curves"] = {"random": {"top1": [60.0, 70.0], "mAP": [40.0, 45.0]}}
    put(root / "adapt/catalogue/procrustes/seed1", study)
    (root / "broken").mkdir()
    (root / "broken" / "metrics.json").write_text("{not json")
    return root


def test_the_report_holds_every_experiment_the_published_rows_apart_and_links_to_each_run(results, tmp_path):
    out, runs, skipped = write_report(results, tmp_path / "page" / "report.html")
    page = out.read_text()
    assert runs == 5 and [p.name for p, _ in skipped] == ["metrics.json"]
    assert "<link" not in page and "src=\"http" not in page  # nothing to fetch at view time
    for label in ("er", "dsimplex_hoc", "lambda_orth", "procrustes"):
        assert f">{label}<" in page, label
    board = page[page.index('id="iamcl2r-synthetic"'):]
    board = board[:board.index("</table>")]
    assert ">NFR self (%)</th>" in board and ">NFR cross (%)</th>" in board
    assert board.count('data-sort="2.5">2.50</td>') == 2 and board.count('data-sort="7.5">7.50</td>') == 2
    published = page[page.index('data-kind="published"'):]
    assert "IAM-CL2R authors&#39; released runs" in published and ">0.952<" in published
    assert "apple/ml-fct README" in page
    # AC_t / AA_t curves; the backfilling of both adapter studies (the model_update run along a stream and the
    # leave-one-out one) and each one's answer in three figures (cross cases, curves, deployments against cost)
    assert page.count("data:image/png;base64,") == 9
    assert page.count("every deployment against what it costs") == 2 * 2  # two studies: alt text and caption
    section = page[page.index('id="iamcl2r-synthetic"'):]
    section = section[:section.index("</section>")]
    verdict = section[section.index("The answer:"):section.index("<table")]
    assert "most compatible: er (AC 1.000" in verdict and "2 seeds" in verdict, "the stream section opens with it"
    assert "not ranked, with fewer: dsimplex_hoc (1)." in verdict, "a one-seed mean is not ranked beside two-seed ones"
    measured = section[:section.index('data-kind="published"')]
    assert "Leaderboard" in measured and ">scenario</th>" not in measured and ">dataset</th>" not in measured, \
        "the heading names them"
    answer = page[page.index('<div class="answer">'):]
    assert answer.index("Recommendation:") < answer.index('class="sortable summary"') < answer.index("<figure>")
    assert ">procrustes<" in answer[:answer.index("</table>")]
    links = re.findall(r'href="(\.\./results/[^"]+)"', page)
    assert "../results/iamcl2r/synthetic/er/seed1/config.yaml" in links
    assert "../results/model_update/synthetic/lambda_orth/seed1/metrics.json" in links
    assert all((out.parent / link).resolve().is_file() for link in links)


def test_a_label_cannot_inject_markup(results, tmp_path):
    record = changed(valid_record(3), "method", "<script>alert(1)</script>")
    put(results / "iamcl2r/synthetic/evil/seed3", record)
    page = write_report(results, tmp_path / "report.html")[0].read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_report_command_writes_one_file_and_refuses_bad_paths_in_one_line(results, tmp_path, capsys):
    assert cli.main(["report", str(results)]) == 0
    assert (results / "report.html").is_file() and "(5 runs)" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    for args, fragment in ((["report", str(tmp_path / "empty")], "no complete metrics.json"),
                           (["report", str(tmp_path / "absent")], "does not exist"),
                           (["report", str(results), "--out", str(tmp_path)], "is a folder")):
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "empty" / "report.html").exists()


def test_the_leaderboard_shows_the_published_figures_apart_only_when_asked(results, capsys):
    assert cli.main(["leaderboard", "--results", str(results)]) == 0
    assert "published" not in capsys.readouterr().out
    assert cli.main(["leaderboard", "--results", str(results), "--published"]) == 0
    out = capsys.readouterr().out
    measured, published = out.split("#### published", 1)
    assert "IAM-CL2R authors' released runs" not in measured
    rows = [line for line in published.splitlines() if "IAM-CL2R authors' released runs" in line]
    assert len(rows) == 2 * len(IAMCL2R_RELEASED["matrices"])  # 7 and 31 tasks, HOC and ER
    assert any("| dsimplex_hoc" in r and "| 0.952 |" in r and "| 68.90 " in r for r in rows), rows
    assert cli.main(["leaderboard", "--results", str(results), "--published", "--format", "csv"]) == 2


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.slow
def test_the_page_in_a_real_browser_has_every_row_decodes_every_image_and_sorts(results, tmp_path):
    """Headless Chromium (Debian's chromium, driven by Playwright): the leaderboard has a row per experiment, every
    image has decoded, a click on AC sorts the rows by the page's script (ascending, then descending), and a
    screenshot is saved (tmp_path/report.png)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    if chromium() is None:
        pytest.skip("no chromium on PATH: apt-get install chromium (CI installs it)")
    out = write_report(results, tmp_path / "report.html")[0]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(out.as_uri())
        page.wait_for_load_state("load")
        images = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
        assert images == [True] * 9
        fits = page.eval_on_selector_all("table.summary",
                                         "ts => ts.map(t => t.scrollWidth <= t.parentElement.clientWidth)")
        assert fits == [True, True] and page.evaluate("document.documentElement.scrollWidth") <= 1400  # no page scroll
        board = page.locator("section#iamcl2r-synthetic table").first
        strategies = lambda: board.locator("tbody tr td:nth-child(1)").all_inner_texts()  # noqa: E731
        assert strategies() == ["er", "dsimplex_hoc"]  # the leaderboard's order: AC, highest first
        heading = board.locator("th", has_text="AC").first
        heading.click()
        assert heading.get_attribute("aria-sort") == "ascending" and strategies() == ["dsimplex_hoc", "er"]
        heading.click()
        assert heading.get_attribute("aria-sort") == "descending" and strategies() == ["er", "dsimplex_hoc"]
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 800})
        deciding = page.eval_on_selector("table.summary", """t => Array.from(t.tHead.rows[0].cells).slice(0, 3)
            .map(c => c.getBoundingClientRect().right)""")
        assert max(deciding) <= 390, f"adapter, compatible and top-1 gain show at 390 px: {deciding}"
        browser.close()
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_an_adapter_study_without_backfilling_curves_has_no_figure_and_breaks_nothing(results, tmp_path):
    record = update_record()
    del record["retrieval"]["backfilling"]["curves"]
    record["method"] = record["config"]["adapter"]["name"] = "procrustes"
    put(results / "model_update/synthetic/procrustes/seed1", record, config=False)
    out, runs, skipped = write_report(results, tmp_path / "report.html")
    assert runs == 6 and len(skipped) == 1, skipped
    assert out.read_text().count("data:image/png;base64,") == 9  # as without it: no curve, no figure


def test_the_report_never_writes_over_a_file_it_did_not_create(results, tmp_path, capsys):
    record = results / "iamcl2r/synthetic/er/seed1/metrics.json"
    before = record.read_bytes()
    assert cli.main(["report", str(results), "--out", str(record)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a report written by runner.py report" in err
    assert record.read_bytes() == before
    page = tmp_path / "page.html"
    page.write_text("<html>someone's notes</html>")
    assert cli.main(["report", str(results), "--out", str(page)]) == 2 and "notes" in page.read_text()
    assert cli.main(["report", str(results), "--out", str(tmp_path / "mine.html")]) == 0
    assert cli.main(["report", str(results), "--out", str(tmp_path / "mine.html")]) == 0  # its own report: rewritten
    earlier = tmp_path / "earlier.html"
    earlier.write_text("<!doctype html>\n<html>\n<head>\n<title>cl2r-bench report: results</title>")
    assert cli.main(["report", str(results), "--out", str(earlier)]) == 0  # one an earlier version wrote
    (tmp_path / "empty").mkdir()
    old_report = tmp_path / "mine.html"
    assert cli.main(["report", str(tmp_path / "empty"), "--out", str(old_report)]) == 2
    assert old_report.is_file()  # nothing to report: the earlier report is left as it was


def test_no_link_can_be_read_as_a_url_scheme(results, tmp_path):
    put(results / "javascript:alert(1)" / "seed9", changed(valid_record(9), "method", "evil"))
    page = write_report(results, tmp_path / "report.html")[0].read_text()
    links = re.findall(r'href="([^"]*)"', page)
    assert links and all(link.startswith(("./", "../", "#")) for link in links), links
    assert not any(re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", link) for link in links)
    assert any("javascript%3Aalert%281%29/seed9/metrics.json" in link for link in links)
