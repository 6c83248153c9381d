"""Headless Chromium for the report: read the rendered DOM back and take screenshots, with no dependency beyond
the browser itself (Debian's ``chromium``, ``scripts/install_browser.sh``).

The page (``report.html``) records after its ``load`` event, on ``<body>``: ``data-loaded``, ``data-height`` /
``data-width`` (document size), ``data-errors`` (script errors it caught), and on each ``<figure data-figure>``:
``data-rendered`` (image decoded with a non-zero size) and ``data-box`` (x, y, width, height in CSS px).
:func:`dump_dom` returns the DOM after load together with the browser's console log (``--enable-logging=stderr``),
from which :func:`console_errors` picks errors; :func:`screenshot_page` shoots the page at a fixed width.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

WIDTH = 1280
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


class BrowserUnavailable(RuntimeError):
    """No headless Chromium on this machine."""


def find_chromium() -> str | None:
    env = os.environ.get("MMFRAGILE_CHROMIUM")
    for c in ((env,) if env else ()) + CHROMIUM_CANDIDATES:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return shutil.which("chromium")


def _run(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise BrowserUnavailable("chromium not found (run scripts/install_browser.sh, or set MMFRAGILE_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="mmfragile-chromium-") as prof:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
               "--disable-dev-shm-usage", f"--user-data-dir={prof}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": prof})


def dump_dom(html_path: str | Path, width: int = WIDTH, height: int = 900, timeout: float = 90) -> tuple[str, str]:
    """(DOM after load, browser log) of ``html_path`` opened from disk."""
    url = Path(html_path).resolve().as_uri()
    p = _run([f"--window-size={width},{height}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000",
              "--dump-dom", url], timeout)
    if p.returncode != 0 or "<html" not in p.stdout:
        raise RuntimeError(f"chromium --dump-dom failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def console_errors(log: str) -> list[str]:
    """Console / script error lines of a Chromium stderr log (``--enable-logging=stderr``): console messages at
    level error (``ERROR:CONSOLE``, ``Uncaught``) and failed loads of the page's own resources."""
    out = []
    for line in log.splitlines():
        if ("CONSOLE" in line and (":ERROR:" in line or "Uncaught" in line or "console.error" in line)) or \
                "Uncaught" in line or "net::ERR_" in line or "Failed to load resource" in line:
            out.append(line.strip())
    return out


def screenshot_page(html_path: str | Path, png_path: str | Path, width: int = WIDTH, height: int | None = None,
                    timeout: float = 120) -> Path:
    """Screenshot of ``html_path`` at ``width`` CSS px; ``height`` None = the whole page (measured first)."""
    if height is None:
        dom, _ = dump_dom(html_path, width, timeout=timeout)
        m = re.search(r'data-height="(\d+)"', dom)
        height = min(int(m.group(1)) if m else 4000, 30000)
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    url = Path(html_path).resolve().as_uri()
    p = _run([f"--window-size={width},{height}", "--virtual-time-budget=10000", f"--screenshot={png_path.resolve()}",
              url], timeout)
    if p.returncode != 0 or not png_path.exists():
        raise RuntimeError(f"chromium --screenshot failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return png_path
