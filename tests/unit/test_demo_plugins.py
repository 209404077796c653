"""Installed plugins in ``reach demo`` without services: the GraphQL plugin's demo hook (found
through its entry point, as the demo finds it) adds its running system, its connector and agent to
a copy of the demo's catalog; a hook that raises, or whose documents clash with the demo's, is left
out in one line while the rest goes on. tests/integration/test_first_run.py runs the whole demo and
reads the GraphQL rows in its table."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from connectors.adapters.plugin import DemoIntent, DemoScene
from connectors.adapters.registry import Plugin, registry
from connectors.catalog import build
from connectors.loader import load_directory
from workers.ops.demo_assets import CATALOG_DIR
from workers.ops.demo_plugins import close, start_scenes

closed: list[str] = []


def explode() -> DemoScene:
    raise RuntimeError("the demo server could not bind\nsecond line")


def clash() -> DemoScene:
    return DemoScene(
        system="a second shop",
        catalog="connector:\n  name: shop\n  endpoint: http://127.0.0.1:9\n  actions:\n"
        "    - {action: ping, path: GET /ping, permission: read}\n",
        connector="shop",
        intents=[DemoIntent(agent="refund_bot", action="shop.ping", expect="succeeded")],
        close=lambda: closed.append("clash"),
    )


def graphql() -> Plugin:
    plugin = registry().get("graphql")
    assert plugin is not None, "reach-graphql is not installed (bash .ci/bootstrap.sh installs it)"
    return plugin


def variant(kind: str, hook: str) -> Plugin:
    """A plugin like the GraphQL one, of another type, whose demo hook is ``hook``."""
    real = graphql()
    assert real.manifest is not None
    manifest = real.manifest.model_copy(update={"type": kind, "demo": f"{__name__}:{hook}"})
    return Plugin(kind, "reach-broken 0.0.1", real.target, "ok", "", manifest, real.module)


def test_without_a_demo_hook_the_demo_runs_on_its_own_catalog(tmp_path: Path) -> None:
    real = graphql()
    assert real.manifest is not None
    silent = Plugin("graphql", real.package, real.target, "ok", "", real.manifest.model_copy(update={"demo": None}))
    refused = Plugin("graphql", real.package, real.target, "refused", "no", real.manifest)
    assert start_scenes(
        [silent, refused, *[p for p in registry().all() if p.builtin]], CATALOG_DIR, tmp_path / "c"
    ) == (
        [],
        CATALOG_DIR,
    )
    assert not (tmp_path / "c").exists()


def test_the_graphql_scene_joins_and_a_raising_hook_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "catalog"
    scenes, catalog_dir = start_scenes(
        [variant("broken", "explode"), graphql(), variant("clashing", "clash")], CATALOG_DIR, out
    )
    try:
        assert catalog_dir == out
        assert [s.plugin.type for s in scenes] == ["graphql"]
        err = capsys.readouterr().err.splitlines()
        assert err[0] == (
            "plugin broken (reach-broken 0.0.1) is left out of the demo: its demo hook "
            f"{__name__}:explode failed: RuntimeError: the demo server could not bind"
        )
        assert err[1].startswith("plugin clashing (reach-broken 0.0.1) is left out of the demo: its catalog does not")
        assert "connector 'shop' is declared twice" in err[1] and len(err) == 2
        assert closed == ["clash"]  # what the left-out hook started is stopped
        # the demo's own documents and the scene's, and nothing of the clashing one
        assert sorted(p.name for p in out.iterdir()) == [
            "plugin-graphql.yaml",
            *sorted(p.name for p in CATALOG_DIR.iterdir() if p.is_file()),
        ]
        catalog, problems = build(load_directory(out))
        assert not problems, problems
        assert catalog.connectors["products"].type == "graphql"
        assert set(catalog.connectors) == {"local_ticket_system", "warehouse", "shop", "products"}
        scene = scenes[0].scene
        assert [i.action for i in scene.intents] == ["products.create_product", "products.get_product"]
        assert {i.agent for i in scene.intents} <= set(catalog.agents)
        # the system the hook started answers the scene's read
        url = scene.system.rsplit(" ", 1)[-1]
        body = json.dumps({"query": '{ product(sku: "P-1") { name } }'}).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {scene.env['PRODUCTS_TOKEN']}"}
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=10) as answer:
            assert json.loads(answer.read()) == {"data": {"product": {"name": "Kettle"}}}
    finally:
        for s in scenes:
            close(s)
