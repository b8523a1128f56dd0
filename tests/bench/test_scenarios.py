"""The benchmark's figures against direct and against the floor (the minimal aiohttp pass-through of the same run):
round by round where a figure is paired, nothing where a column is missing; and the floor itself relays."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bench.processes import minor_faults
from bench.scenarios import ByColumn, added, faults, over_floor, per_shape, throughput_over_floor
from bench.table import column_order
from tests.fakes.serving import serve_app

ROOT = Path(__file__).resolve().parents[2]


def rounds(**columns: list[float]) -> ByColumn:
    return {column.replace("_", " "): [{"rps": value, "p50_ms": value} for value in values]
            for column, values in columns.items()}


@pytest.mark.parametrize(("figures", "expected"), [
    ({"floor": 2.0, "proxy on": 3.0, "proxy off": 2.0, "direct": 1.0, "nginx": 0.5},
     {"proxy on": 1.5, "proxy off": 1.0}),
    ({"proxy on": 3.0}, {}),                       # no floor in the run: no ratio
    ({"floor": 0.0, "proxy on": 3.0}, {}),         # a floor of nothing is no reference
    ({"floor": -0.1, "proxy on": 3.0}, {}),        # an "added" figure below direct's (noise) either
])
def test_a_figure_over_the_floors(figures: dict[str, float], expected: dict[str, float]) -> None:
    assert over_floor(figures) == pytest.approx(expected)


def test_per_shape_rows_give_each_targets_figure_then_the_same_over_the_floors() -> None:
    by_target = {"floor": {"small": 2e6, "long": 4e6}, "proxy on": {"small": 3e6, "long": 5e6}}
    rows = per_shape(by_target, ["long", "small"], "instructions per request", "M", scale=1e-6)
    assert [(row.label, row.unit) for row in rows] == [
        ("long: instructions per request", "M"), ("long: the same / floor's", "x"),
        ("small: instructions per request", "M"), ("small: the same / floor's", "x")]
    assert rows[0].values == pytest.approx({"floor": 4.0, "proxy on": 5.0})
    assert rows[1].values == pytest.approx({"proxy on": 1.25})  # the ratio of the figures, whatever the scale
    assert rows[3].values == pytest.approx({"proxy on": 1.5})
    assert per_shape({"proxy on": {"small": 3.0}}, ["small"], "calls", "calls")[1].values == {}  # no floor
    outside = per_shape(by_target, ["small"], "outside memory copies", "M", scale=1e-6, same="outside memory copies")
    assert [row.label for row in outside] == ["small: outside memory copies", "small: outside memory copies / floor's"]
    assert outside[1].values == pytest.approx({"proxy on": 1.5})


def test_throughput_over_the_floor_is_paired_round_by_round() -> None:
    # Round 1 was slow for everyone, round 2 fast: per round the proxy keeps 0.5 and 0.8 of the floor.
    by_column = rounds(direct=[100, 400], floor=[50, 200], proxy_on=[25, 160])
    assert throughput_over_floor(by_column) == pytest.approx({"proxy on": 0.65})
    assert throughput_over_floor(rounds(direct=[100], proxy_on=[25])) == {}           # no floor
    assert throughput_over_floor(rounds(floor=[50, 60], proxy_on=[25])) == {}         # rounds missing


def test_added_figures_are_against_direct_and_the_floor_has_its_own() -> None:
    by_column = rounds(direct=[1.0, 2.0], floor=[1.5, 2.5], proxy_on=[3.0, 4.0])
    figures = added(by_column, "p50_ms")
    assert figures == pytest.approx({"floor": 0.5, "proxy on": 2.0})
    assert over_floor(figures) == pytest.approx({"proxy on": 4.0})
    assert column_order(["proxy on", "floor", "direct"]) == ["direct", "floor", "proxy on"]
    assert not math.isnan(figures["floor"])


def test_page_faults_are_read_from_proc_and_reported_per_target() -> None:
    before = minor_faults(os.getpid(), with_children=False)
    held = bytearray(32 << 20)  # zeroed on allocation: every one of its 8,192 pages touched
    assert minor_faults(os.getpid(), with_children=False) - before >= 4096
    assert len(held) == 32 << 20
    by_column = {"direct": [{"faults_per_request": 1.0}], "floor": [{"faults_per_request": value} for value in
                                                                    (12.0, 311.0, 77.0)],
                 "proxy on": [{"faults_per_request": 0.1}]}
    assert faults(by_column) == {"floor": 77.0, "proxy on": 0.1}  # medians; the upstream's own are no hop's


async def answer(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if request.headers.get("x-stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-seen": str(len(body))})
        await response.prepare(request)
        for index in range(3):
            await response.write(f"data: {index}\n\n".encode())
        await response.write_eof()
        return response
    seen = {"path": request.path_qs, "bytes": len(body), "auth": request.headers.get("Authorization")}
    return web.json_response(seen, status=201)


async def test_the_floor_relays_bodies_statuses_and_streams(tmp_path: Path) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner, upstream = await serve_app(app)
    ready = tmp_path / "floor.port"
    floor = subprocess.Popen([sys.executable, "-m", "bench.floor", "--upstream", upstream, "--port", "0",
                              "--ready-file", str(ready)], cwd=ROOT)
    try:
        for _ in range(200):
            if ready.exists() or floor.poll() is not None:
                break
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{ready.read_text()}"
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/x?a=1", data=b"x" * 100_000,
                                    headers={"Authorization": "Bearer k"}) as response:
                assert response.status == 201
                body: dict[str, Any] = json.loads(await response.read())
                assert body == {"path": "/v1/x?a=1", "bytes": 100_000, "auth": "Bearer k"}
            async with session.post(f"{url}/s", data=b"{}", headers={"x-stream": "1"}) as response:
                assert response.headers["x-seen"] == "2"
                assert await response.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    finally:
        floor.terminate()
        floor.wait(10)
        await runner.cleanup()
    assert floor.returncode == 0  # SIGTERM ends it cleanly
