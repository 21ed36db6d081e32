"""The spend page in a real headless Chromium: every chart drawn by the served Plotly bundle under
the page's content security policy, no console error of any level above INFO, a label that looks
like markup shown as text, and a screenshot that is not blank."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
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


async def test_spend_per_day_shows_the_costliest_models_and_the_rest_as_one(gw: GatewayHandle) -> None:
    """200 models made 200 traces: a 1.6 MB page, a legend to scroll and Plotly's ten colours
    repeated. Over ten models the chart has the nine costliest, costliest first, and one
    `(other models)` trace holding the rest's cost on each day."""
    assert gw.service.engine is not None
    base = seeded_records(30)
    records = [
        msgspec.structs.replace(
            record,
            started_at=datetime(2026, 11, 27 + n % 2, 12, tzinfo=UTC),
            finished_at=datetime(2026, 11, 27 + n % 2, 12, 0, 1, tzinfo=UTC),
            status="ok",
            model=f"model-{n // 2:02d}",
            cost_usd=Decimal(n // 2 + 1),  # model-14 the costliest, 15 dollars a day
            cost_source="estimated",
        )
        for n, record in enumerate(base)
    ]
    await write_records(gw.service.engine, records)
    page = await gw.client.get("/usage", params={"from": "2026-11-27", "to": "2026-11-29"})
    found = re.search(r"<script type='application/json' id='usage-data'>(.*?)</script>", page.text)
    assert found is not None
    daily = json.loads(found.group(1))["daily"]
    assert [trace["name"] for trace in daily] == [f"model-{n:02d}" for n in range(14, 5, -1)] + ["(other models)"]
    for trace in daily:
        assert trace["x"] == ["2026-11-27", "2026-11-28"]
    assert daily[0]["y"] == [15.0, 15.0]
    assert daily[-1]["y"] == [float(sum(range(1, 7)))] * 2  # model-00 to model-05: 1 + … + 6 dollars a day
