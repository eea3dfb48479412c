"""The README's screenshots of `bertkit explore`, and each view's time to answer in a real browser.

Starts `bertkit explore` (the demo model and the task models given), opens every view in headless
Chromium (Debian's chromium and chromium-driver, driven by Selenium), waits for its numbers, and
saves a full-page PNG per view in this folder. Prints each view's time from request to drawn page
(the page's own `data-ms`: fetch, JSON, drawing).

    python docs/explore/screenshots.py runs/quickstart/model --model sentiment=runs/zh-sentiment \\
        --model ner=runs/zh-ner
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

VIEWS = ["visibility", "assembly", "masking", "fillmask", "attention", "tasks"]
HERE = Path(__file__).parent


def start(args) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "bertkit.cli", "explore", args.model_dir, "--port", "0"]
    for task in args.tasks:
        command += ["--model", task]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        print(line.rstrip())
        found = re.search(r"explorer on (http://\S+/)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise SystemExit("bertkit explore did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default="runs/quickstart/model")
    parser.add_argument("--model", dest="tasks", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={args.width},900"):
        options.add_argument(flag)
    proc, url = start(args)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)
    try:
        driver.get(url)
        for number, name in enumerate(VIEWS, 1):
            root = driver.find_element(By.CSS_SELECTOR, f'[data-testid="view-{name}"]')
            driver.find_element(By.CSS_SELECTOR, f'[data-testid="tab-{name}"]').click()
            WebDriverWait(driver, 60).until(lambda _, root=root: root.get_attribute("data-state") == "ready")
            time.sleep(0.3)  # let the browser finish painting
            height = driver.execute_script("return document.documentElement.scrollHeight")
            png = driver.execute_cdp_cmd("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": args.width, "height": height, "scale": 1}})
            path = Path(args.out) / f"{number}-{name}.png"
            path.write_bytes(base64.b64decode(png["data"]))
            print(f"{name:<11} {root.get_attribute('data-ms') or '-':>5} ms  → {path}")
    finally:
        driver.quit()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
