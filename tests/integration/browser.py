"""A real browser for the console tests: the Debian packages' headless Chromium, driven by Selenium.

The driver path is given explicitly, so Selenium Manager never looks for (or downloads) a
browser or a driver. A machine without the packages fails the tests that use it, never skips:
`bash .ci/test` installs them (apt: chromium chromium-driver).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 800)


def chromium(log_dir: Path | None = None) -> webdriver.Chrome:
    """A new headless Chromium (its own profile directory, removed with the process's temp files)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not found: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root in a container: Chromium's sandbox needs user namespaces
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={tempfile.mkdtemp(prefix='reach-chromium-')}",
    ):
        options.add_argument(argument)
    log = str(log_dir / "chromedriver.log") if log_dir else None
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER, log_output=log), options=options)
    driver.set_page_load_timeout(30)
    # the page itself WINDOW big (the window's size includes what would be browser chrome)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False},
    )
    return driver
