"""docs/results.md and the README's results table are what bench/results_page.py makes from the committed JSON
today: a regenerated result whose page was not rewritten, or a figure edited by hand, fails here."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.quick


def test_the_results_page_is_generated_from_the_committed_json():
    from bench.results_page import PAGE, page

    assert PAGE.read_text() == page(), "docs/results.md is stale: run python bench/results_page.py --write"


def test_the_readme_quotes_the_generated_blocks():
    from bench.results_page import readme_blocks

    readme = (ROOT / "README.md").read_text()
    for (begin, end), block in readme_blocks().items():
        assert begin in readme and end in readme, f"README lost the block {begin}"
        quoted = readme.split(begin, 1)[1].split(end, 1)[0]
        assert quoted == f"\n{block}", f"README's block {begin} is stale: run python bench/results_page.py --write"


def test_write_replaces_only_the_readme_blocks(tmp_path):
    from bench.results_page import README_BEGIN, README_END, SUITE_BEGIN, SUITE_END, readme_block, suite_time_block, write

    readme, page = tmp_path / "README.md", tmp_path / "results.md"
    readme.write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\nmiddle\n{SUITE_BEGIN}\nold\n{SUITE_END}\nafter\n")
    write(readme, page)
    assert readme.read_text() == (f"intro\n{README_BEGIN}\n{readme_block()}{README_END}\nmiddle\n"
                                  f"{SUITE_BEGIN}\n{suite_time_block()}{SUITE_END}\nafter\n")
    assert page.read_text().startswith("# Results")


def test_the_suite_time_sentence_says_every_figure_of_its_json(tmp_path, monkeypatch):
    import json

    import bench.results_page as results_page

    figures = {"command": "python bench/suite_time.py --quick-runs 2 --ci", "cores": 2,
               "quick": {"command": "python -m pytest -m quick", "max_wall_s": 27.4, "max_load_1min": 0.3,
                         "runs": [{"wall_s": 27.4}, {"wall_s": 25.0}]},
               "ci": {"command": "bash .ci/run", "wall_s": 1380.0, "max_load_1min": 1.2}}
    (tmp_path / "suite_time.json").write_text(json.dumps(figures))
    monkeypatch.setattr(results_page, "RESULTS", tmp_path)
    said = results_page.suite_time_block()
    for figure in ("2 cores", "27 s", "2 runs", "load at most 0.3", "1380 s, 23.0 minutes", "load at most 1.2",
                   "python bench/suite_time.py --quick-runs 2 --ci", "`bash .ci/run`"):
        assert figure in said, (figure, said)


def test_suite_time_refuses_a_negative_run_count(tmp_path):
    from bench import suite_time

    with pytest.raises(SystemExit):
        suite_time.main(["--quick-runs", "-1", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
