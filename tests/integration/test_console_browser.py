"""The web console in a real browser (Debian's chromium driven by Playwright) against a real public gateway,
a real internal gateway, a real SmolLM2 replica with the demo's trained adapters, PostgreSQL and Kafka: the
public page loads, a chat streams with the adapter's id and tier, a deploy made on the internal gateway's
operator page moves the alias and the next chat is the new version's, with its sign-off, the fleet view
shows the replica live, and a wrong key shows OpenAI's error from the API. The public listener serves no
admin API."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from demo.cli import prepare_adapters
from demo.recipe import PERSONAS
from gateway.config import GatewayConfig
from harness.stacks.gateway import ADAPTERS, ADMIN_TOKEN, GatewayStack, gateway_stack
from lorafleet.model.prepare import ensure_default_model
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
REPLICA = f"gwc{uuid.uuid4().hex[:6]}-a"  # its own id prefix: the gateway routes only to this stack's replica
TIMEOUT_MS = 90_000  # a chat on a loaded 2-core machine, first load of the adapter included


SIGN_OFFS = {p.adapter_id: p.sign_off for p in PERSONAS}


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    from lorafleet.model.base_hash import base_model_hash

    base_hash = base_model_hash(ensure_default_model())
    # the demo's trained set (cached under .data/; a fresh clone trains it once): versions sign off apart
    dirs = await asyncio.to_thread(prepare_adapters, GatewayConfig.from_env())
    assert set(ADAPTERS) <= set(dirs), sorted(dirs)
    root = next(iter(dirs.values())).parent  # one folder per adapter id, as the stack's replicas read them
    work = tmp_path_factory.mktemp("gw")
    # No relay here: the public gateway reads a moved alias again once its cached entry is this old.
    ttl = {"LORAFLEET_GATEWAY_ALIAS_CACHE_TTL_S": "0.5"}
    async with gateway_stack(
        services.settings(), root, base_hash, work, replica_ids=(REPLICA,), extra_env=ttl, internal=True
    ) as s:
        await wait_until(lambda: _routes_to(s, REPLICA), "the replica to become live in the gateway", 90)
        yield s


async def _routes_to(stack: GatewayStack, replica_id: str) -> bool:
    async with httpx.AsyncClient() as c:
        return replica_id in (await c.get(f"{stack.url}/ready")).json().get("replicas", [])


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])
        yield b
        await b.close()


async def _open(browser: Browser, url: str) -> AsyncIterator[Page]:
    context = await browser.new_context()
    p = await context.new_page()
    p.set_default_timeout(TIMEOUT_MS)
    await p.goto(f"{url}/console/")
    yield p
    await context.close()


@pytest.fixture
async def page(browser: Browser, stack: GatewayStack) -> AsyncIterator[Page]:
    """The public gateway's console page: the tenants' chat playground."""
    async for p in _open(browser, stack.url):
        yield p


@pytest.fixture
async def operator(browser: Browser, stack: GatewayStack) -> AsyncIterator[Page]:
    """The internal gateway's console page: fleet, registry and reports."""
    async for p in _open(browser, stack.internal_url):
        yield p


async def _chat(page: Page, done_before: int) -> tuple[str, str, str]:
    """Send the prompt; (adapter id, tier, answer) of the exchange it adds."""
    async with page.expect_response("**/v1/chat/completions") as response:
        await page.click("#send")
    resp = await response.value
    assert resp.headers["content-type"].startswith("text/event-stream"), (resp.status, await resp.text())
    await expect(page.locator(".exchange.done")).to_have_count(done_before + 1, timeout=TIMEOUT_MS)
    newest = page.locator(".exchange").first
    return (
        await newest.locator(".adapter-id").inner_text(),
        await newest.locator(".adapter-tier").inner_text(),
        await newest.locator(".answer").inner_text(),
    )


async def _alias_target(stack: GatewayStack, alias: str) -> str:
    conn = await asyncpg.connect(stack.database_url)
    try:
        return await conn.fetchval("SELECT adapter_id FROM aliases WHERE alias = $1", alias)
    finally:
        await conn.close()


async def test_each_listener_shows_only_its_own_views(page: Page, operator: Page) -> None:
    await expect(page.locator(".tab")).to_have_count(1)
    await expect(page.locator("#tab-chat")).to_be_visible()
    for view in ("fleet", "registry", "reports"):
        await expect(page.locator(f"#view-{view}")).to_have_count(0)
        await expect(operator.locator(f"#tab-{view}")).to_be_visible()
    await expect(operator.locator("#view-chat")).to_have_count(0)
    await expect(operator.locator("#view-fleet")).to_be_visible()


async def test_a_chat_streams_then_a_deploy_on_the_page_moves_the_alias_and_the_next_chat(
    page: Page, operator: Page, stack: GatewayStack
) -> None:
    await expect(page).to_have_title("lorafleet console")
    await page.fill("#api-key", stack.keys["acme"])
    await page.click("#load-models")
    await expect(page.locator("#alias option[value='acme/support:prod']")).to_have_count(1)
    await page.select_option("#alias", "acme/support:prod")
    await page.fill("#prompt", "What is the capital of Italy?")
    await page.fill("#max-tokens", "48")  # room for the answer and its sign-off

    adapter, tier, first_answer = await _chat(page, 0)
    assert adapter == "acme-support-v1"
    assert tier in ("gpu", "ram", "disk", "remote")
    assert first_answer.strip().endswith(SIGN_OFFS["acme-support-v1"]), first_answer
    meta = page.locator(".exchange").first
    assert (await meta.locator(".ttft").inner_text()).endswith(" ms")
    assert int(await meta.locator(".tokens").inner_text()) >= 2
    assert float(await meta.locator(".tokens-per-s").inner_text()) > 0

    await operator.click("#tab-registry")
    await operator.fill("#admin-token-registry", ADMIN_TOKEN)
    await operator.click("#registry-load")
    row = operator.locator("tr[data-alias='acme/support:prod']")
    await expect(row.locator(".alias-adapter")).to_have_text("acme-support-v1")
    await row.locator(".deploy-target").select_option("acme-support-v2")
    await row.locator(".deploy").click()
    await expect(row.locator(".alias-adapter")).to_have_text("acme-support-v2")
    assert await _alias_target(stack, "acme/support:prod") == "acme-support-v2"

    await asyncio.sleep(1.0)  # the public gateway's cached entry expires
    adapter, _tier, second_answer = await _chat(page, 1)
    assert adapter == "acme-support-v2"
    assert second_answer.strip().endswith(SIGN_OFFS["acme-support-v2"]), second_answer  # the new sign-off

    await row.locator(".rollback").click()
    await expect(row.locator(".alias-adapter")).to_have_text("acme-support-v1")
    assert await _alias_target(stack, "acme/support:prod") == "acme-support-v1"


async def test_a_wrong_key_shows_openais_error_from_the_api(page: Page, stack: GatewayStack) -> None:
    async with httpx.AsyncClient() as c:
        resp = await c.post(
            f"{stack.url}/v1/chat/completions",
            headers={"Authorization": "Bearer sk-not-a-key"},
            json={"model": "acme/support:prod", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert resp.status_code == 401
    message = resp.json()["error"]["message"]

    await page.fill("#api-key", "sk-not-a-key")
    await page.click("#load-models")
    await expect(page.locator("#chat-error")).to_contain_text(message)
    await page.click("#send")
    await expect(page.locator("#chat-error")).to_contain_text(message)
    await expect(page.locator("#chat-error")).to_contain_text("invalid_api_key")
    await expect(page.locator(".exchange")).to_have_count(0)


async def test_the_fleet_view_shows_the_replica_live_behind_the_token(
    operator: Page, stack: GatewayStack
) -> None:
    page = operator
    await page.click("#tab-fleet")
    await page.fill("#admin-token-fleet", "not-the-token")
    await page.click("#fleet-connect")
    await expect(page.locator("#fleet-error")).to_contain_text("invalid_service_token")

    await page.fill("#admin-token-fleet", ADMIN_TOKEN)
    await page.click("#fleet-connect")
    await expect(page.locator("#fleet-status")).to_have_text("live")
    replica = page.locator(f"tr[data-replica='{REPLICA}']")
    await expect(replica.locator(".status")).to_have_text("ready")
    await expect(replica.locator(".gpu-hit-rate")).to_have_text(re.compile(r"^(-|\d+%)$"))
    async with httpx.AsyncClient() as c:  # a request through the public gateway: its completion gives a share
        chat = {
            "model": "acme/support:prod",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        headers = {"Authorization": f"Bearer {stack.keys['acme']}"}
        resp = await c.post(f"{stack.url}/v1/chat/completions", json=chat, headers=headers, timeout=120)
        assert resp.status_code == 200, resp.text
    await expect(replica.locator(".gpu-hit-rate")).to_have_text(re.compile(r"^\d+%$"))

    async def pushed_again() -> bool:  # a snapshot a second, not a one-off page
        first = await page.locator("#fleet-summary").inner_text()
        await asyncio.sleep(1.5)
        return await page.locator("#fleet-summary").inner_text() != first

    await wait_until(pushed_again, "the fleet view to update live", 30)


async def test_the_console_links_the_latest_reports_and_serves_their_plots(
    operator: Page, stack: GatewayStack
) -> None:
    await operator.click("#tab-reports")
    link = operator.locator("#reports a", has_text="Simulator grid")  # bench/results/simgrid.html, committed
    href = await link.get_attribute("href")
    assert href is not None
    async with httpx.AsyncClient(base_url=stack.internal_url) as c:
        report = await c.get(href)
        assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
        assert '<img src="simgrid.png"' in report.text
        plot = await c.get(f"{href}simgrid.png")
        assert plot.status_code == 200 and plot.content[:8] == b"\x89PNG\r\n\x1a\n"
        for outside in (f"{href}simgrid.json", f"{href}..%2F..%2Fpyproject.toml", "/console/reports/99/"):
            refused = await c.get(outside)
            assert refused.status_code == 404  # in OpenAI's shape, whichever route answered
            assert refused.json()["error"]["code"] in ("report_not_found", "not_found")


async def test_the_screenshot_command_saves_each_view(stack: GatewayStack, tmp_path) -> None:
    from bench.console_screenshots import take_screenshots

    shots = await take_screenshots(
        stack.url, stack.internal_url, stack.keys["acme"], ADMIN_TOKEN, tmp_path, "Hello", 120
    )
    assert [p.name for p in shots] == ["chat.png", "fleet.png", "registry.png", "reports.png"]
    for shot in shots:
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_the_console_admin_api_refuses_a_tenant_key(stack: GatewayStack) -> None:
    async with httpx.AsyncClient(base_url=stack.internal_url) as c:
        for path in ("/console/api/fleet", "/console/api/registry"):
            resp = await c.get(path, headers={"Authorization": f"Bearer {stack.keys['acme']}"})
            assert resp.status_code == 401, (path, resp.status_code, resp.text)
            assert set(resp.json()["error"]) >= {"message", "type", "code"}
        put = await c.put(
            "/console/api/aliases/acme/support:prod",
            json={"adapter_id": "acme-support-v2"},
            headers={"Authorization": f"Bearer {stack.keys['acme']}"},
        )
        assert put.status_code == 401, put.text
    assert await _alias_target(stack, "acme/support:prod") == "acme-support-v1"


async def test_the_public_listener_serves_no_admin_api_and_no_reports(stack: GatewayStack) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as c:
        for path in (
            "/console/api/fleet",
            "/console/api/registry",
            "/console/api/reports",
            "/console/reports/2/",
        ):
            resp = await c.get(path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert resp.status_code == 404, (path, resp.status_code, resp.text)
        put = await c.put(
            "/console/api/aliases/acme/support:prod",
            json={"adapter_id": "acme-support-v2"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert put.status_code in (404, 405), put.text
    assert await _alias_target(stack, "acme/support:prod") == "acme-support-v1"
