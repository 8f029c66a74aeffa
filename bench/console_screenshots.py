"""`lorafleet console url` prints where the console's two pages are: the tenants' chat playground on the
public gateway, the operator's views on the internal one. `lorafleet console screenshots` drives both pages
of a running stack in Debian's chromium (Playwright) and saves a PNG of each view: a streamed chat, the
live fleet, the registry and the reports."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.config import GatewaySettings

if TYPE_CHECKING:  # imported where it runs (the bench extra): `lorafleet --help` needs no browser
    from playwright.async_api import Page

app = typer.Typer(no_args_is_help=True)

CHROMIUM = "/usr/bin/chromium"


@app.callback()
def _group() -> None:
    """The web console."""


async def take_screenshots(
    url: str, internal_url: str, api_key: str, token: str, out: Path, prompt: str, timeout_s: float = 120.0
) -> list[Path]:
    """chat.png (the public page), fleet.png, registry.png and reports.png (the internal page's) under out;
    each view filled in before its shot."""
    from playwright.async_api import async_playwright, expect

    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    ms = timeout_s * 1000
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(ms)
            await page.goto(f"{url.rstrip('/')}/console/")
            await page.fill("#api-key", api_key)
            await page.click("#load-models")
            await expect(page.locator("#alias option").first).to_be_attached(timeout=ms)
            await page.fill("#prompt", prompt)
            await page.click("#send")
            await expect(page.locator(".exchange.done")).to_have_count(1, timeout=ms)
            shots.append(await _shot(page, out / "chat.png"))

            await page.goto(f"{internal_url.rstrip('/')}/console/")
            await page.click("#tab-fleet")
            await page.fill("#admin-token-fleet", token)
            await page.click("#fleet-connect")
            await expect(page.locator("#fleet-table tbody tr").first).to_be_attached(timeout=ms)
            shots.append(await _shot(page, out / "fleet.png"))

            await page.click("#tab-registry")
            await page.click("#registry-load")
            await expect(page.locator("#aliases-table tbody tr").first).to_be_attached(timeout=ms)
            shots.append(await _shot(page, out / "registry.png"))

            await page.click("#tab-reports")
            await expect(page.locator("#reports li").first).to_be_attached(timeout=ms)
            shots.append(await _shot(page, out / "reports.png"))
        finally:
            await browser.close()
    return shots


async def _shot(page: Page, path: Path) -> Path:
    await page.screenshot(path=str(path), full_page=True)
    return path


@app.command("url")
def url_cmd() -> None:
    """The console's pages: the chat playground on the public gateway, the operator's views (fleet,
    registry, reports; they take the service token) on the internal one."""
    settings = GatewaySettings()
    typer.echo(f"console: {settings.public_base_url()}/console/")
    typer.echo(f"operator console: {settings.internal_base_url()}/console/")


@app.command("screenshots")
def screenshots(
    url: Annotated[str, typer.Option(help="The public gateway.")] = "http://127.0.0.1:18080",
    internal_url: Annotated[str, typer.Option(help="The internal gateway.")] = "http://127.0.0.1:18081",
    keys: Annotated[Path, typer.Option(help="JSON {tenant: api key} (lorafleet demo writes it).")] = Path(
        ".data/demo/keys.json"
    ),
    tenant: Annotated[str, typer.Option(help="The tenant whose key the chat uses.")] = "acme",
    out: Annotated[Path, typer.Option(help="Folder for the PNGs.")] = Path("docs/img"),
    prompt: Annotated[str, typer.Option(help="What the chat asks.")] = "How do I reset my password?",
) -> None:
    """Screenshot each console view of a running stack (the service token is the gateway's setting)."""
    api_key = json.loads(keys.read_text())[tenant]
    token = GatewaySettings().service_token.get_secret_value()
    for path in asyncio.run(take_screenshots(url, internal_url, api_key, token, out, prompt)):
        typer.echo(str(path))
