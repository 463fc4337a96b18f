"""The real servers end-to-end tests start on 127.0.0.1, and how their processes are stopped and read."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM (serve pauses its deployments), then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`prefect server start` on a free port with its own PREFECT_HOME, the UI served too:
    (api url, environment for its clients), until the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_API_URL=url, PREFECT_SERVER_ANALYTICS_ENABLED="false", CI="1",
               PREFECT_UI_ENABLED="true", PREFECT_UI_API_URL=url)
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                                 "--analytics-off"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=home)
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "prefect server did not start:\n" + tail(log)
            time.sleep(1)
        yield url, env
    finally:
        stop(proc)


class MlflowServer:
    """`mlflow server` on 127.0.0.1:port with its own SQLite store (or `store`, an existing one, e.g. a
    pipeline run's: what a person opens in the UI), stoppable and restartable."""

    def __init__(self, root: Path, store: str | None = None):
        self.root, self.proc, self.store = root, None, store or f"sqlite:///{root / 'server.db'}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> None:
        exe = Path(sys.executable).with_name("mlflow")
        cmd = [str(exe), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
               "--backend-store-uri", self.store,
               "--default-artifact-root", str(self.root / "server-artifacts")]
        log = (self.root / "server.log").open("a")
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no job scheduler: starts sooner
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow server not healthy after {timeout:.0f} s")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its workers
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def chromium_page(browser: str, url: str, tmp_path: Path, shot: Path | None = None) -> str:
    """The DOM of `url` as headless Chromium renders a server's UI there (Prefect's, MLflow's) (and its screenshot into `shot`)."""
    # 20 s of the page's virtual time: it only runs while no request is pending, so the SPA's reads all answer
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1000",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=20000"]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.stdout.strip(), f"chromium rendered nothing at {url}\n{dom.stderr[-2000:]}"
    if shot is not None:
        proc = subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
        assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    return dom.stdout


def paused_run(api: str, proc: subprocess.Popen, after_key: str | None = None, timeout: float = 600) -> dict:
    """The flow run paused on the Prefect server at `api` (a pause other than `after_key`, the pause key of
    one already answered), while `proc`, the process that runs it, lives."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["PAUSED"]}}}}).json()
        runs = [r for r in runs if r["state"]["state_details"].get("pause_key") != after_key]
        if runs:
            return runs[0]
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) without pausing"
        time.sleep(1)
    raise AssertionError(f"no flow run paused in {timeout:.0f} s")


def answer_in_prefect_ui(api: str, run_id: str, form: dict[str, str], shot: Path | None = None) -> None:
    """Open the paused flow run's page in headless Chromium (Playwright driving Debian's chromium), press
    Resume, fill the form a person sees (`form`: a select's option by its text, a text field by its
    label) and submit it; `shot`: a screenshot of the filled form."""
    from playwright.sync_api import expect, sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=args)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{api.removesuffix('/api')}/runs/flow-run/{run_id}")
            page.get_by_role("button", name="Resume").first.click()
            dialog = page.locator(".p-modal__card")
            expect(dialog.get_by_text("asks a person")).to_be_visible(timeout=30_000)
            for label, value in form.items():
                field = dialog.locator(".schema-form-property").filter(has_text=label).first
                select = field.locator(".p-select-button__control")
                if select.count():
                    select.focus()
                    page.keyboard.press("ArrowDown")  # opens the options (a click only focuses it headless)
                    page.locator(".p-select-option", has_text=value).first.click()
                else:
                    field.locator("textarea, input").first.fill(value)
            if shot is not None:
                page.screenshot(path=str(shot))
            dialog.get_by_role("button", name="Submit").click()
            expect(dialog).to_be_hidden(timeout=30_000)
        finally:
            browser.close()
