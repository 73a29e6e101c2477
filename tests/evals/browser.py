"""Open a report in a real headless Chromium (playwright driving Debian's chromium).

``open_report`` loads the page from its file, refuses every request that is not the file
itself or inline data (a report fetches nothing), collects console errors and uncaught
exceptions, waits for the page's own checks (``window.reportChecks``), and saves screenshots:
collapsed, one problem opened with its samples, everything expanded. No browser is downloaded:
playwright gets the system chromium's path; ``scripts/ensure_chromium.sh`` installs it (root,
apt) when missing, and only when that fails does a test skip, with the script's message.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENSURE = ROOT / "scripts" / "ensure_chromium.sh"


def chromium() -> str:
    """The chromium executable, installed on first use when this machine lacks it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    done = subprocess.run([str(ENSURE)], capture_output=True, text=True, timeout=900)
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not Path(path).exists():
        pytest.skip(f"no Chromium and {ENSURE.name} could not install it: {done.stderr.strip()}")
    return path


@dataclass
class PageRun:
    """What the browser saw."""

    checks: dict[str, Any]
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    blocked: list[str] = field(default_factory=list)  # requests that left the file
    shots: list[Path] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # measured after clicking


def open_report(path: Path, shots: Path, name: str) -> PageRun:
    """Load ``path``, run its checks, click the first problem and its samples open, screenshot."""
    from playwright.sync_api import sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    blocked: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
            page.route("**/*", lambda route: _only_local(route, path, blocked))
            page.goto(path.resolve().as_uri())
            page.wait_for_function("window.reportChecks !== undefined", timeout=15_000)
            run = PageRun(page.evaluate("window.reportChecks"), errors, blocked)
            run.shots.append(_shot(page, shots / f"{name}-collapsed.png"))
            run.facts = _open_first_problem(page)
            run.shots.append(_shot(page, shots / f"{name}-problem-open.png"))
            page.get_by_role("button", name="expand all").first.click()
            run.shots.append(_shot(page, shots / f"{name}-expanded.png"))
        finally:
            browser.close()
    for shot in run.shots:
        print(f"screenshot: {shot}")  # the test log names them
    return run


def _only_local(route: Any, path: Path, blocked: list[str]) -> None:
    url = route.request.url
    if url == path.resolve().as_uri() or url.startswith("data:"):
        route.continue_()
    else:
        blocked.append(url)
        route.abort()


def _shot(page: Any, target: Path) -> Path:
    page.screenshot(path=str(target), full_page=True)
    return target


def _open_first_problem(page: Any) -> dict[str, Any]:
    """Click the first problem open, then each of its samples; report what became visible."""
    problem = page.locator("details.problem").first
    problem.locator(":scope > summary").click()
    samples = problem.locator("details.sample")
    for i in range(samples.count()):
        samples.nth(i).locator(":scope > summary").click()
    visible = problem.locator(".transcript").evaluate_all(
        "els => els.filter(e => e.getBoundingClientRect().height > 0).length"
    )
    return {
        "problem_open": problem.evaluate("d => d.open"),
        "samples": samples.count(),
        "transcripts_visible": visible,
        "columns": problem.locator(".cols > div").evaluate_all(
            "els => els.map(e => {const r = e.getBoundingClientRect(); return [r.x, r.y];})"
        ),
    }
