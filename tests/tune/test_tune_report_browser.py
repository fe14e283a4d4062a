"""The tune report as a reader sees it, in headless Chromium (Debian's chromium and
chromium-driver, as the status page tests): the answer and the shipped configuration side by
side first, then the top configurations, then one chart where only those are labelled lines
(the others faint points) with the latency budget marked, then the details."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oceanus.tune.output import config_text, recommended_config
from oceanus.tune.report import TOP, RunInfo, render
from oceanus.tune.space import Candidate
from oceanus.tune.sweep import Outcome, Trial
from tests.frontends.metrics import browser as chromium_browser
from tests.tune.test_tune_units import SIMPLE, config, outcome, point


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium_browser.require()
    with chromium_browser.chromium(1100, 900) as driver:
        yield driver


def many() -> Outcome:
    """The unit tests' outcome with eight more configurations: more than TOP."""
    result = outcome()
    for index in range(8):
        trial = Trial(3 + index, Candidate(1, 8, True, delay_us=100 * (index + 1)), "queue delay")
        trial.points = [point(trial.id, 1, 900 + 50 * index, 1), point(trial.id, 2, 1000, 30)]
        result.trials.append(trial)
    return result


def test_report_reads_top_down(tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    result = many()
    info = RunInfo("simple", 10.0, 3.0, 170.0, 2, "built-in", "today", "started here", 1.0)
    text = recommended_config(result, config(), SIMPLE) or ""
    page = tmp_path / "report.html"
    page.write_text(render(result, info, text, config_text(config())), encoding="utf-8")
    browser.get(page.as_uri())
    headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h2")]
    assert headings == [
        "The recommendation and the shipped configuration",
        "Top configurations",
        "Throughput against p99 latency",
        "Details",
    ]
    versus = browser.find_element(By.CSS_SELECTOR, "table.versus")
    header = [th.text for th in versus.find_elements(By.TAG_NAME, "th")]
    assert header == ["", "Recommended: #2", "Shipped: #1"]
    rows = {
        tr.find_elements(By.TAG_NAME, "td")[0].text: [
            td.text for td in tr.find_elements(By.TAG_NAME, "td")[1:]
        ]
        for tr in versus.find_elements(By.TAG_NAME, "tr")[1:]
    }
    assert rows["throughput at p99 ≤ 10 ms (what was compared)"] == [
        "2,500 infer/s",
        "1,400 infer/s",
    ]
    assert rows["model instances"] == ["2", "1"]
    assert rows["dynamic batching, max queue delay"] == ["on, 0 µs", "off, 0 µs"]
    # the better of the two is marked, and it is the recommendation's throughput
    better = versus.find_elements(By.CSS_SELECTOR, "td.better")
    assert better[0].text == "2,500 infer/s"
    # the top table: TOP configurations best first (the shipped one is among them here)
    top = browser.find_element(By.ID, "top").find_element(By.XPATH, "following::table[1]")
    ids = [
        tr.find_elements(By.TAG_NAME, "td")[0].text
        for tr in top.find_elements(By.TAG_NAME, "tr")[1:]
    ]
    assert ids[:2] == ["#2", "#1"] and len(ids) == TOP
    # the chart: one labelled line per top configuration, the rest faint points, the budget
    chart = browser.find_element(By.ID, "chart").find_element(
        By.XPATH, "following::*[name()='svg'][1]"
    )
    labels = [t.text for t in chart.find_elements(By.TAG_NAME, "text")]
    assert "#2 recommended" in labels and "#1 shipped" in labels
    assert "p99 budget 10 ms" in labels
    lines = chart.find_elements(By.TAG_NAME, "polyline")
    assert len(lines) == TOP  # every top configuration has two points or more here
    faint = chart.find_elements(By.CSS_SELECTOR, "circle[fill='#8a94a3']")
    assert len(faint) == 2 * (len(result.trials) - TOP)
    # laid out: the chart is visible and as wide as the text column, below the tables
    assert chart.size["width"] > 700 and chart.location["y"] > top.location["y"]
    browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").stat().st_size > 10_000
