"""Saves the docs' screenshots of the status page: `python -m tests.web.screenshots [docs/img]`.

The same repository as the browser tests (without the hostile job), served by `reconciler serve` on
127.0.0.1 and photographed by headless Chromium."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.web.conftest import CHROMIUM, start_server, stop_server
from tests.web.scenario import build


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sc = build(Path(tmp), hostile=False)
        server = start_server(sc.path)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1360, "height": 480})
                page.goto(server.url + "/")
                page.screenshot(path=str(out / "status-overview.png"))
                page.set_viewport_size({"width": 1240, "height": 820})
                page.goto(server.url + "/job/train")
                page.screenshot(path=str(out / "status-job.png"))
                browser.close()
        finally:
            stop_server(server)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
