"""The web page at / and mlxray's /mlxray/status, over HTTP and in a real browser (headless
Chromium driven by Selenium): the page loads, asks for the API key, streams a chat answer equal
to the API's greedy answer, stops a long generation (the slot is freed), keeps the conversation
across a reload, its status view shows every slot, and in router mode its model picker shows
each model's status and loads the one picked.

Screenshots go to a temporary folder; ``make screenshots`` writes the ones the README shows
(``MLXRAY_SCREENSHOTS=docs/img``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..conftest import MODEL, wait_for
from ..local_graph import local_graph
from ..reliability import dedicated_app

KEY = "webui-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEBUI_ARGS = {"model": MODEL, "alias": "tiny-python", "n_parallel": 2, "n_ctx": 512,
              "n_batch": 64, "api_key": KEY}


@pytest.fixture(scope="module")
def webui_base(serve_instance) -> Iterator[str]:
    with dedicated_app(serve_instance, "webui", WEBUI_ARGS) as base:
        yield base


# the routes' tests gain nothing from a model or Ray: the graph in-process, on the fake engine
@pytest.fixture(scope="module")
def no_webui() -> Iterator[httpx.Client]:
    with local_graph({"n_parallel": 1, "n_ctx": 256, "webui": False}) as client:
        yield client


@pytest.fixture(scope="module")
def static(tmp_path_factory) -> Iterator[httpx.Client]:
    """--path: a folder of its own files, a secret file beside it."""
    root = tmp_path_factory.mktemp("static")
    (root / "secret.txt").write_text("not served")
    site = root / "site"
    (site / "docs").mkdir(parents=True)
    (site / "webui").mkdir()
    (site / "index.html").write_text("<html><body>custom ui</body></html>")
    (site / "docs" / "note.txt").write_text("a note")
    (site / "docs" / "index.html").write_text("docs index")
    (site / "webui" / "app.js").write_text("console.log('custom');")
    with local_graph({"n_parallel": 1, "n_ctx": 256, "static_path": str(site)}) as client:
        yield client


# ---- over HTTP -----------------------------------------------------------------------------
def test_page_and_assets_are_public_and_resolve_under_the_route_prefix(webui_base):
    page = httpx.get(webui_base + "/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<base href="/webui/">' in page.text  # relative API paths stay under the prefix
    assert httpx.get(webui_base + "/index.html").text == page.text
    for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css")]:
        asset = httpx.get(f"{webui_base}/webui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert httpx.get(webui_base + "/webui/secret.txt").status_code == 404
    # the API itself keeps its key
    assert httpx.get(webui_base + "/v1/models").status_code == 401
    assert httpx.get(webui_base + "/props", headers=AUTH).json()["ui"] is True


def test_status_gathers_every_replica(webui_base):
    assert httpx.get(webui_base + "/mlxray/status").status_code == 401
    body = wait_for(lambda: (r := httpx.get(webui_base + "/mlxray/status", headers=AUTH).json())
                    ["models"][0]["replicas"] and r, what="a replica's first report")
    (model,) = body["models"]
    assert model["name"] == "tiny-python" and model["n_parallel"] == 2
    assert model["deployment"] == "ModelReplica"
    assert model["deployment_status"] == "HEALTHY" and model["replica_states"] == {"RUNNING": 1}
    (replica,) = model["replicas"]
    assert [s["id"] for s in replica["slots"]] == [0, 1]
    before = replica["tokens_predicted_total"]
    out = httpx.post(webui_base + "/completion", headers=AUTH, timeout=60,
                     json={"prompt": "def f():\n", "n_predict": 5, "temperature": 0})
    assert out.json()["tokens_predicted"] == 5

    def counted():
        body = httpx.get(webui_base + "/mlxray/status", headers=AUTH).json()
        assert "models" in body, body
        replica = body["models"][0]["replicas"][0]
        return replica["tokens_predicted_total"] == before + 5 and replica

    replica = wait_for(counted, what="the tokens in the next report")
    assert all(not s["is_processing"] for s in replica["slots"])


def test_no_webui_answers_as_an_unknown_route(no_webui):
    for path in ("/", "/index.html", "/webui/app.js"):
        answer = no_webui.get(path)
        assert answer.status_code == 404
        assert answer.json()["error"]["type"] == "not_found_error"
    assert no_webui.get("/props").json()["ui"] is False


def test_path_serves_the_folder_instead_of_the_page(static):
    page = static.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == "<html><body>custom ui</body></html>"
    assert static.get("/index.html").text == page.text
    note = static.get("/docs/note.txt")
    assert note.text == "a note" and note.headers["content-type"].startswith("text/plain")
    assert static.get("/docs/").text == "docs index"
    assert static.get("/webui/app.js").text == "console.log('custom');"
    # the built-in page's assets are not there, nor anything outside the folder
    for path in ("/webui/style.css", "/absent.html", "/%2E%2E/secret.txt",
                 "/docs/%2E%2E/%2E%2E/secret.txt", "/..%2Fsecret.txt"):
        answer = static.get(path)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["type"] == "not_found_error"
    # the API is unaffected
    assert static.get("/health").json() == {"status": "ok"}
    assert static.get("/props").json()["ui"] is True
    assert static.get("/completion").status_code == 404  # a POST-only route
    out = static.post("/completion", json={"prompt": "def f():\n", "n_predict": 3,
                                           "temperature": 0})
    assert out.json()["tokens_predicted"] == 3


# ---- in a browser --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    if not chromium or not driver_path:
        pytest.skip("no Chromium here: apt-get install chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=driver_path))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("MLXRAY_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def by_id(driver, name: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, name)


def messages(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#messages .message")


def set_field(driver, name: str, value: str) -> None:
    field = by_id(driver, "set-" + name)
    field.clear()
    field.send_keys(value)


def send(driver, text: str) -> None:
    by_id(driver, "prompt").send_keys(text)
    by_id(driver, "send").click()


def idle(driver) -> bool:
    return by_id(driver, "send").is_enabled()


def api_greedy_answer(base: str, text: str, max_tokens: int) -> str:
    out = httpx.post(base + "/v1/chat/completions", headers=AUTH, timeout=60, json={
        "model": "tiny-python", "messages": [{"role": "user", "content": text}],
        "temperature": 0, "top_p": 0.95, "max_tokens": max_tokens})
    return out.json()["choices"][0]["message"]["content"]


def test_chat_in_the_browser(browser, webui_base, shots):
    driver = browser
    driver.get(webui_base + "/")
    # /v1/models answers 401: the page asks for the key, keeps it and sends it from then on
    dialog = wait_for(lambda: by_id(driver, "key-dialog").get_attribute("open") is not None
                      and by_id(driver, "key-dialog"), what="the key dialog")
    by_id(driver, "key-input").send_keys(KEY)
    by_id(driver, "key-save").click()
    wait_for(lambda: by_id(driver, "model").get_attribute("value") == "tiny-python",
             what="the model list")
    assert not dialog.get_attribute("open")

    by_id(driver, "settings-toggle").click()
    set_field(driver, "temperature", "0")
    set_field(driver, "max_tokens", "24")
    driver.save_screenshot(str(shots / "webui-settings.png"))
    send(driver, "def parse(path):")
    wait_for(lambda: len(messages(driver)) == 2 and idle(driver), what="the answer")
    answer = messages(driver)[1]
    expected = api_greedy_answer(webui_base, "def parse(path):", 24)
    stored = driver.execute_script("return JSON.parse(localStorage['mlxray.chat'])[1].content")
    assert stored == expected  # the streamed deltas add up to the API's greedy answer
    assert answer.find_element("css selector", ".content").text == expected.strip()
    timings = answer.find_element("css selector", ".timings").text
    assert "generated 24 tokens" in timings and "cache hit" in timings
    driver.save_screenshot(str(shots / "webui-chat.png"))

    # kept in the browser: a reload shows the same conversation
    driver.refresh()
    wait_for(lambda: len(messages(driver)) == 2, what="the stored conversation")
    stored = driver.execute_script("return JSON.parse(localStorage['mlxray.chat'])")
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == expected


def test_stop_frees_the_slot_and_the_status_view_shows_it(browser, webui_base, shots):
    driver = browser
    driver.get(webui_base + "/")
    wait_for(lambda: by_id(driver, "model").get_attribute("value") == "tiny-python",
             what="the model list")
    by_id(driver, "new-chat").click()
    by_id(driver, "settings-toggle").click()
    set_field(driver, "max_tokens", "400")
    set_field(driver, "grammar", 'root ::= [a-z ]+')  # no end of generation before 400 tokens
    send(driver, "a long answer")

    def busy_slot():
        slots = httpx.get(webui_base + "/slots", headers=AUTH).json()
        return any(s["is_processing"] for s in slots)

    # read in the page: the streaming message's element is replaced as its text grows
    wait_for(lambda: driver.execute_script(
        "const m = document.querySelectorAll('#messages .message');"
        "return m.length === 2 ? m[1].textContent.length : 0") > 10, what="streamed text")
    assert busy_slot()
    by_id(driver, "stop").click()
    wait_for(lambda: idle(driver), what="the stop")
    wait_for(lambda: not busy_slot(), timeout=10, what="the slot freed")
    assert "stopped" in messages(driver)[1].find_element("css selector", ".timings").text
    partial = driver.execute_script("return JSON.parse(localStorage['mlxray.chat'])[1].content")
    assert 0 < len(partial) and set(partial) <= set("abcdefghijklmnopqrstuvwxyz ")

    by_id(driver, "tab-status").click()

    def slot_states():  # read in one script: the view re-renders its cards on every poll
        return driver.execute_script(
            "return [...document.querySelectorAll('.model-card .slot')]"
            ".map(s => s.getAttribute('data-state'))")

    wait_for(lambda: slot_states() == ["idle", "idle"], what="two idle slots in the view")
    model, text = driver.execute_script(
        "const c = document.querySelector('.model-card');"
        "return [c.getAttribute('data-model'), c.innerText]")
    assert model == "tiny-python"
    assert "1 replica reporting" in text and "2 slots each" in text
    driver.save_screenshot(str(shots / "webui-status.png"))


@pytest.fixture(scope="module")
def router_base(serve_instance, tmp_path_factory) -> Iterator[str]:
    """Router mode: two models of a folder, one loaded at a time."""
    from deployments.cli import command as cli

    root = tmp_path_factory.mktemp("picker")
    for name in ("tiny-a", "tiny-b"):
        (root / name).symlink_to(Path(MODEL).resolve(), target_is_directory=True)
    argv = ["--models-dir", str(root), "-c", "256", "-np", "1", "--models-max", "1"]
    args = cli.serve_config(cli.parse(argv, {}))["applications"][0]["args"]
    with dedicated_app(serve_instance, "picker", args,
                       {"ray_actor_options": {"num_cpus": 0.25}}) as base:
        yield base


def test_the_model_picker_shows_each_status_and_loads_the_one_picked(browser, router_base,
                                                                     shots):
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(router_base + "/")

    def labels() -> list[str]:
        return driver.execute_script("return [...document.querySelectorAll('#model option')]"
                                     ".map(o => o.textContent)")

    wait_for(lambda: labels() == ["tiny-a (unloaded)", "tiny-b (unloaded)"], what="the picker")
    Select(by_id(driver, "model")).select_by_value("tiny-b")
    wait_for(lambda: labels() == ["tiny-a (unloaded)", "tiny-b (loaded)"], timeout=60,
             what="tiny-b loaded from the picker")
    Select(by_id(driver, "model")).select_by_value("tiny-a")  # --models-max 1: tiny-b makes room
    wait_for(lambda: labels() == ["tiny-a (loaded)", "tiny-b (unloaded)"], timeout=60,
             what="tiny-a loaded in tiny-b's place")
    statuses = {m["id"]: m["status"]["value"]
                for m in httpx.get(router_base + "/models").json()["data"]}
    assert statuses == {"tiny-a": "loaded", "tiny-b": "unloaded"}
    driver.save_screenshot(str(shots / "webui-router.png"))
