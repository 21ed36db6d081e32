"""The spend page in a real headless Chromium: every chart drawn by the served Plotly bundle under
the page's content security policy, no console error of any level above INFO, a label that looks
like markup shown as text, and a screenshot that is not blank."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from catalog.ledger_write import write_records
from tests.catalog.usage_oracle import seeded_records
from tests.support.browser import chromium, png_pixels
from tests.support.gateway import GatewayHandle

CHARTS = ("chart-daily", "chart-keys", "chart-models", "chart-tokens")
MARKUP = '<a href="https://evil.example/">pay</a><b>here</b>'  # Plotly reads both as markup in a label


def visit(url: str) -> dict[str, Any]:
    """Load the page, wait for its charts, and collect what a person would see and the console."""
    with chromium() as driver:
        driver.get(url)
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.body.dataset.charts") == "ready")
        return {
            "console": driver.get_log("browser"),
            "bars": {chart: len(driver.find_elements(By.CSS_SELECTOR, f"#{chart} g.point")) for chart in CHARTS},
            "legend": [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#chart-daily g.legend text.legendtext")],
            "links": [e.get_attribute("href") for e in driver.find_elements(By.CSS_SELECTOR, ".charts a")],
            "totals": driver.find_element(By.ID, "totals").text,
            "screenshot": driver.get_screenshot_as_png(),
        }


async def test_the_page_draws_its_charts_in_chromium(gw: GatewayHandle) -> None:
    assert gw.service.engine is not None
    records = seeded_records()
    records[-1] = msgspec.structs.replace(records[-1], model=MARKUP)  # a catalog model id that looks like markup
    await write_records(gw.service.engine, records)
    seen = await asyncio.to_thread(visit, f"{gw.url}/usage?from=2026-11-27&to=2026-12-01")

    assert [entry for entry in seen["console"] if entry["level"] not in ("INFO", "DEBUG")] == []
    assert seen["bars"]["chart-daily"] >= 4 * 3  # four days, stacked by model
    assert seen["bars"]["chart-keys"] == 4  # key-a, key-b, key-c and (none)
    assert seen["bars"]["chart-models"] == 5
    assert seen["bars"]["chart-tokens"] == 5
    assert sorted(seen["legend"]) == ["(none)", MARKUP, "gemma", "llama", "qwen"]  # as text, not a link
    assert seen["links"] == []
    assert "requests 600" in seen["totals"]

    width, height, rows = png_pixels(seen["screenshot"])
    background = rows[0][:3]
    pixels = [row[x : x + 3] for row in rows[::4] for x in range(0, len(row), 4 * (len(row) // width))]
    drawn = sum(1 for pixel in pixels if pixel != background)
    assert (width, height) == (1280, 1000) or width >= 1000
    assert drawn > len(pixels) // 20, "the screenshot is (almost) blank"
    assert len(set(pixels)) > 20, "the screenshot has too few colours to hold charts"
