"""The privacy-budget dashboard in a real headless Chromium against a running local federation.

Debian's ``chromium`` driven through its ``chromium-driver`` by Selenium (``scripts/bootstrap.sh`` installs
both; nothing is downloaded). The guardian and the student start first, so the page is open before any
batch exists; then the teacher parties start and the federation labels until its budget ends the stream.
The page refuses without the token (and with a wrong one), shows exactly the figures the REST API returns,
and updates after batches without reloading; its ε chart is drawn over the entries' time; it requests nothing
outside the guardian's origin (Chromium's performance log). ``capc budget watch`` is checked against the
same API. The screenshot lands in ``build/test-output/dashboard.png`` (or ``$CAPC_TEST_OUTPUT``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from protocol_force import protocol_force

from capc_services.local.federation import token as admin_token
from capc_services.local.layout import Layout
from capc_services.local.processes import (
    PartyProcess,
    probe,
    start_party,
    stop_processes,
    tail,
    wait_ready,
    write_state,
)
from capc_services.local.provision import Endpoints, LocalOptions, free_port, provision
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import train_party_heads

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _chromium(require: Callable[[bool, str], None]) -> None:
    """Before any federation starts: a real browser, or a skip that says why (a failure under CI=true)."""
    require(
        CHROMIUM is not None and DRIVER is not None,
        "Debian's chromium and chromium-driver are not installed (scripts/bootstrap.sh installs them with "
        "apt-get where it can: apt-get install chromium chromium-driver)",
    )


OUTPUT = Path(
    os.environ.get("CAPC_TEST_OUTPUT", Path(__file__).resolve().parents[2] / "build" / "test-output")
)
# Ten heads per party, σ2 = 10: 16-query batches cost ≤ 1.96 RDP each, so ε = 10 pays for several batches
# and then ends the stream (the dashboard shows the whole arc: spending, then exhaustion).
OPTIONS = LocalOptions(
    parties=2,
    teachers_per_party=10,
    dataset="fashion-mnist",
    backbone="scatter-28x28x1",
    generator="dead_leaves",
    epsilon=10.0,
    order=10.0,
    sigma1=12.0,
    sigma2=10.0,
    queries=400,
    batch_size=16,
    bn_batch=16,
    train_limit=400,
    evaluation_images=256,
    pipeline_depth=0,
    force=protocol_force("dashboard"),
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1440,1250",
)


@dataclass
class Federation:
    layout: Layout
    endpoints: Endpoints
    processes: list[PartyProcess]
    token: str

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.endpoints.admin['guardian']}"

    def rest(self, route: str) -> Any:
        reply = httpx.get(f"{self.admin}/api/v1/{route}", headers={"Authorization": f"Bearer {self.token}"})
        reply.raise_for_status()
        return reply.json()

    def start_teachers(self) -> None:
        teachers = [
            start_party(self.layout, party=name, role="teacher", admin_port=self.endpoints.admin[name])
            for name in ("hospital-1", "hospital-2")
        ]
        self.processes += teachers
        write_state(self.layout, endpoints=self.endpoints, processes=self.processes)
        wait_ready(self.layout, teachers, timeout=120)

    def logs(self) -> str:
        return "\n".join(f"--- {p.party}\n{tail(self.layout.log(p.party), lines=15)}" for p in self.processes)


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """Guardian and student running, teacher heads trained, teachers not started yet."""
    layout, config, endpoints = provision(tmp_path_factory.mktemp("dash") / "federation", OPTIONS)
    for name in config.teacher_names:
        train_party_heads(TeacherSettings.load(layout.site(name)))
    roles = [(config.guardian, "guardian"), (config.student, "student")]
    processes = [start_party(layout, party=p, role=r, admin_port=endpoints.admin[p]) for p, r in roles]
    running = Federation(layout=layout, endpoints=endpoints, processes=processes, token=admin_token(layout))
    write_state(layout, endpoints=endpoints, processes=processes)  # what `capc local up` records
    try:
        wait_ready(layout, processes, timeout=120)
        yield running
    finally:
        stop_processes(running.processes, grace=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for downloads
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # every request the page makes
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _until(
    what: str, ready: Callable[[], Any], *, timeout: float = 60, federation: Federation | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{federation.logs() if federation else ''}")
        time.sleep(0.25)


def _page_fields(driver: Any) -> dict[str, Any]:
    """Every figure on the page that names a REST field: {field: raw value as JSON}."""
    script = """
      const out = {};
      for (const e of document.querySelectorAll("[data-field][data-value]")) {
        out[e.dataset.field] = e.dataset.value;
      }
      return out;
    """
    return {k: json.loads(v) for k, v in driver.execute_script(script).items()}


def _refreshes(driver: Any) -> int:
    return int(driver.execute_script("return Number(document.body.dataset.refreshes || 0)"))


def _assert_page_equals_rest(driver: Any, fed: Federation) -> dict[str, Any]:
    """Wait for a refresh after reading the REST API, then compare every figure the page shows with it."""
    budget = fed.rest("budget")
    seen = _refreshes(driver)
    _until("a refresh after the REST read", lambda: _refreshes(driver) > seen + 1)
    assert fed.rest("budget") == {**budget}, "the budget moved during the comparison"
    page = _page_fields(driver)
    shown = {k: v for k, v in budget.items() if k in page}
    assert {"epsilon_settled", "epsilon_spent", "epsilon_limit", "delta", "order", "queries", "answered",
            "head", "entries", "noise"} <= shown.keys()  # fmt: skip
    assert {k: page[k] for k in shown} == shown
    return budget


def test_the_page_and_api_refuse_without_the_token(federation: Federation, browser: Any) -> None:
    assert httpx.get(f"{federation.admin}/api/v1/budget").status_code == 401
    reply = httpx.get(f"{federation.admin}/dashboard")
    assert reply.status_code == 200 and "script-src 'self'" in reply.headers["content-security-policy"]
    assert httpx.get(f"{federation.admin}/dashboard/dashboard.html").status_code == 404
    assert httpx.get(f"{federation.admin}/dashboard/..%2Fapi.py").status_code == 404
    for fragment, says in (
        ("", "needs its admin bearer token"),
        ("#token=not-the-token", "refused the token"),
    ):
        browser.get("about:blank")  # a fragment change alone would not load the page again
        browser.get(f"{federation.admin}/dashboard{fragment}")
        _until(
            "the refusal", lambda: browser.execute_script("return document.body.dataset.state") == "refused"
        )
        message = browser.find_element("id", "auth-message").text
        assert says in message
        assert not browser.find_element("id", "board").is_displayed()
        assert _page_fields(browser) == {}, "no figure may be shown without the token"


def test_with_the_token_it_shows_the_rest_numbers_and_updates_after_batches(
    federation: Federation, browser: Any
) -> None:
    # Prepare: the page open before any batch (teachers not started yet); the link with the token opened
    # in the tab that still shows the refusal (a fragment change: the page takes the token without reload)
    browser.get(f"{federation.admin}/dashboard#token={federation.token}")
    _until("the first refresh", lambda: _refreshes(browser) >= 1, federation=federation)
    assert "token" not in browser.current_url, "the token must leave the address bar"
    before = _assert_page_equals_rest(browser, federation)
    assert before["queries"] == 0 and before["entries"] == 0
    browser.execute_script("window.__sameDocument = 'marker'")
    # Execute: the hospitals come online and the federation labels until its budget runs out
    federation.start_teachers()
    _until(
        "the page to show a settled batch",
        lambda: _page_fields(browser).get("batches", 0) >= 1,
        timeout=180,
        federation=federation,
    )
    assert browser.execute_script("return window.__sameDocument") == "marker", "the page reloaded"
    student = _until(
        "the student to publish",
        lambda: (
            (s := federation.rest("student"))["reachable"] and s["progress"]["state"] == "published" and s
        ),
        timeout=300,
        federation=federation,
    )
    # Assert: every figure equals the API's, for the finished run
    after = _assert_page_equals_rest(browser, federation)
    assert (
        after["queries"] > 0 and after["batches"] >= 2 and after["epsilon_settled"] <= after["epsilon_limit"]
    )
    assert browser.execute_script("return window.__sameDocument") == "marker"
    card = student["model_card"]
    # Each refresh re-renders these parts: read them in one script call, not element by element.
    shown = {
        k: json.loads(v)
        for k, v in browser.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('[data-student][data-value]')]"
            ".map(e => [e.dataset.student, e.dataset.value]))"
        ).items()
    }
    assert shown["card_epsilon"] == card["privacy"]["epsilon"]
    assert shown["queries"] == student["progress"]["queries"] and shown["state"] == "published"
    parties = federation.rest("parties")["parties"]
    rows = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#parties tr[data-party]')].map(r => "
        "[r.dataset.party, Object.fromEntries([...r.cells].map(c => [c.dataset.col, c.textContent]))]))"
    )
    for name in ("hospital-1", "hospital-2"):
        assert rows[name]["batches"] == str(parties[name]["batches"]) and parties[name]["batches"] >= 1
        assert rows[name]["queries"] == str(parties[name]["queries"])
        epsilon = browser.execute_script(
            "return document.querySelector(`#parties tr[data-party='${arguments[0]}'] "
            "td[data-col=epsilon_worst_case]`).dataset.value",
            name,
        )
        assert json.loads(epsilon) == parties[name]["epsilon_worst_case"] > 0
    assert "never sees" in browser.find_element("id", "cap-note").text  # no cap invented for a hospital
    history = federation.rest("budget/history")
    assert history["points"][-1]["epsilon_settled"] == after["epsilon_settled"]
    _assert_epsilon_chart_is_over_time(browser, history["points"])
    _assert_one_bar_per_batch(browser, after, history["batches"])
    _assert_the_guarantee_is_the_headline(browser, after)
    student_row = rows["student"]  # the guardian counts the batches the student opened
    assert student_row["batches"] == str(parties["student"]["batches"]), (student_row, parties["student"])
    assert parties["student"]["batches"] >= after["batches"] + after["released_batches"]  # it opened each
    verified = browser.find_element("id", "verify-result")
    assert verified.get_attribute("data-head") == after["head"], "the verification is of the current head"
    assert verified.get_attribute("data-ok") == "true" and f"ok: {after['entries']} entries" in verified.text
    browser.execute_script("document.getElementById('verify-result').dataset.head = ''")
    browser.find_element("id", "verify-now").click()
    _until("the ledger verification", lambda: verified.get_attribute("data-head") == after["head"])
    banner = browser.find_element("id", "noise-banner")
    assert banner.get_attribute("data-secure") == "true" and "SystemNoise" in banner.text
    OUTPUT.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(OUTPUT / "dashboard.png"))
    _assert_no_request_left_the_origin(browser, federation.admin)


def _assert_one_bar_per_batch(driver: Any, budget: dict[str, Any], batches: list[dict[str, Any]]) -> None:
    """One bar per finished batch, counted against the REST budget's batches (a batch's reserve and compute
    rows once made 43 bars of 22 batches, every other with 0 answered)."""
    bars = driver.execute_script(
        "return [...document.querySelectorAll('#chart-batches rect:not(.answered)')]"
        ".map(r => r.querySelector('title').textContent.split(':')[0])"
    )
    finished = budget["batches"] + budget["released_batches"]
    assert 2 <= finished <= 60, budget  # every finished batch is in the latest 60
    assert len(bars) == len(set(bars)) == finished == len(batches), (bars, budget)
    assert bars == [b["batch_id"] for b in batches]
    assert len(driver.find_elements("css selector", "#chart-batches rect.answered")) == finished


def _assert_the_guarantee_is_the_headline(driver: Any, budget: dict[str, Any]) -> None:
    """The published ε is the filter's limit (the guarantee); the realised spend is the odometer beside it,
    and the "budget used" percentage says it is of the Rényi budget, with the ε fraction next to it."""
    cards = driver.execute_script(
        "const t = (s) => document.querySelector(s).textContent.replace(/\\s+/g, ' ').trim();"
        "return {guarantee: t('#card-guarantee h2'), headline: t('#card-guarantee .big'),"
        " spend: t('#card-spend h2'), spent: t('#card-spend .big'), rdp: t('#card-rdp h2'),"
        " rdpText: t('#card-rdp .muted'), percent: t('#epsilon-percent')};"
    )
    assert cards["guarantee"] == "ε guarantee" and cards["headline"] == f"ε {_fmt(budget['epsilon_limit'])}"
    assert cards["spend"] == "realised spend (odometer; the guarantee is the limit)"
    assert cards["spent"] == f"ε {_fmt(budget['epsilon_spent'])}"
    assert "RDP, not ε" in cards["rdp"] and "ε is not proportional to RDP" in cards["rdpText"]
    assert cards["percent"] == f"{100 * budget['epsilon_spent'] / budget['epsilon_limit']:.1f}"
    assert _page_fields(driver)["percent_used"] == pytest.approx(100 * budget["fraction_used"])


def _fmt(value: float) -> str:
    """The page's number format (fmt in dashboard.js) for the values these tests meet."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def _assert_epsilon_chart_is_over_time(driver: Any, points: list[dict[str, Any]]) -> None:
    """The ε chart's x axis is the entries' time (labelled, with clock ticks), not their sequence number."""
    chart = driver.execute_script(
        "const svg = document.getElementById('chart-epsilon');"
        "return {scale: svg.dataset, label: svg.querySelector('.x-label').textContent,"
        " ticks: [...svg.querySelectorAll('.x-tick')].map(t => t.textContent),"
        " settled: svg.querySelector('polyline.settled').getAttribute('points')};"
    )
    scale = {k: float(v) for k, v in chart["scale"].items()}
    assert chart["label"].startswith("time (local, from ")
    assert len(chart["ticks"]) >= 2 and len(set(chart["ticks"])) == len(chart["ticks"]), chart["ticks"]
    assert all(re.fullmatch(r"\d\d:\d\d(:\d\d(\.\d)?)?", t) for t in chart["ticks"]), chart["ticks"]
    assert scale["t0"] == points[0]["time"] and scale["t1"] == max(points[-1]["time"], points[0]["time"] + 1)
    vertices = [float(v.split(",")[0]) for v in chart["settled"].split()]
    per_second = (scale["x1"] - scale["x0"]) / (scale["t1"] - scale["t0"])
    for point in points:  # each entry has a step at its own time
        expected = scale["x0"] + (point["time"] - scale["t0"]) * per_second
        assert min(abs(v - expected) for v in vertices) < 0.02, (point, expected)


def _assert_no_request_left_the_origin(driver: Any, origin: str) -> None:
    """Every request a guardian page made, in Chromium's performance log since the browser started, went to
    the guardian (the browser's own chrome:// pages, such as its first new tab, are not the dashboard's)."""
    requests = [
        message["params"]
        for entry in driver.get_log("performance")
        if (message := json.loads(entry["message"])["message"])["method"] == "Network.requestWillBeSent"
    ]
    urls = [r["request"]["url"] for r in requests if r.get("documentURL", "").startswith(f"{origin}/")]
    assert f"{origin}/dashboard/dashboard.js" in urls and f"{origin}/api/v1/budget" in urls, urls[:20]
    outside = sorted({u for u in urls if not u.startswith(f"{origin}/") and not u.startswith("data:")})
    assert outside == [], f"the page requested outside the guardian's origin: {outside}"


def _documented_command(federation: Federation, out: Path) -> str:
    """docs/operations.md's headless-Chromium command, with this federation's address and token file."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    block = text.split("<!-- headless-chromium -->", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.startswith("chromium --headless") and "--virtual-time-budget=" in block, block
    replaced = (
        block.replace("https://GUARDIAN:8080", federation.admin)
        .replace("/etc/capc/certs/admin.token", str(federation.layout.admin_token("guardian")))
        .replace("/etc/capc/certs/guardian.crt", str(federation.layout.certs / "guardian.crt"))
        .replace("--screenshot=dashboard.png", f"--screenshot={out}")
    )
    return replaced.replace("chromium ", f"{CHROMIUM} ", 1)


def test_the_documented_headless_command_captures_the_loaded_page(
    federation: Federation, tmp_path: Path
) -> None:
    """A plain `--screenshot` captured "not loaded"; the documented command lets the page fetch and draw."""
    png = tmp_path / "dashboard.png"
    command = _documented_command(federation, png)
    shot = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert shot.returncode == 0 and png.stat().st_size > 20_000, shot.stderr[-2000:]
    dom = subprocess.run(
        ["bash", "-c", command.replace(f"--screenshot={png}", "--dump-dom")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-state="board"' in dom.stdout and 'id="updated">updated ' in dom.stdout
    assert "not loaded" not in dom.stdout
    refreshes = int(re.search(r'data-refreshes="(\d+)"', dom.stdout).group(1))  # type: ignore[union-attr]
    assert refreshes >= 2


def test_budget_watch_prints_the_same_numbers(federation: Federation, capc) -> None:
    budget = federation.rest("budget")
    proc = capc("budget", "watch", "--local", str(federation.layout.root), "--count", "1", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    snap = json.loads(proc.stdout)
    assert snap["budget"] == budget and snap["student"]["reachable"] is True
    text = capc(
        "budget",
        "watch",
        "--url",
        federation.admin,
        "--token-file",
        str(federation.layout.admin_token("guardian")),
        "--count",
        "1",
    )
    assert text.returncode == 0, text.stderr
    assert f"ε settled {budget['epsilon_settled']:.3f} of {budget['epsilon_limit']:.3f}" in text.stdout
    assert f"queries {budget['queries']} asked, {budget['answered']} answered" in text.stdout
    assert "hospital-1" in text.stdout and "published model: ε" in text.stdout
    refused = capc("budget", "watch", "--url", federation.admin, "--token-file", str(_bad_token(federation)))
    assert refused.returncode == 2 and "refused the admin token" in refused.stderr


def _bad_token(federation: Federation) -> Path:
    path = federation.layout.root / "wrong.token"
    if not path.exists():
        path.write_text("x" * 40)
        path.chmod(0o600)
    return path


def test_seeded_noise_is_announced_loudly(federation: Federation, browser: Any, tmp_path: Path) -> None:
    """A guardian of a federation on the test-only seeded noise: the page says, in red, that nothing it
    labels is private."""
    seeded = yaml.safe_load(federation.layout.federation.read_text())
    seeded["mechanism"]["insecure_noise_seed"] = "dashboard-test"
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(seeded))
    site = yaml.safe_load(federation.layout.site("guardian").read_text())
    base = federation.layout.sites
    admin = free_port()
    site.update(
        federation=str(tmp_path / "federation.yaml"),
        tls={k: str((base / v).resolve()) for k, v in site["tls"].items()},
        admin={"bind": f"127.0.0.1:{admin}", "token_file": str(federation.layout.admin_token("guardian"))},
        grpc={"bind": f"127.0.0.1:{free_port()}"},
        ledger=str(tmp_path / "ledger.sqlite"),
    )
    site.pop("student_admin", None)
    path = tmp_path / "guardian-seeded.yaml"
    path.write_text(yaml.safe_dump(site))
    log = (tmp_path / "guardian.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "capc_cli", "guardian", "serve", "--site", str(path)], stdout=log, stderr=log
    )
    try:
        url = f"http://127.0.0.1:{admin}"
        _until("the seeded guardian", lambda: probe(f"{url}/readyz")[0] == 200, timeout=60)
        browser.get("about:blank")
        browser.get(f"{url}/dashboard#token={federation.token}")
        banner = _until("the noise banner", lambda: _shown(browser, "noise-banner"))
        assert banner.get_attribute("data-secure") == "false"
        assert "INSECURE NOISE" in banner.text and "NOT differentially private" in banner.text
        assert "insecure" in banner.get_attribute("class")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _shown(driver: Any, element_id: str) -> Any:
    element = driver.find_element("id", element_id)
    return element if element.is_displayed() and element.text else None
