"""The chat page at GET / in a real headless browser (Debian's chromium + chromium-driver, driven by selenium): send
a message, see the reply stream in piece by piece, reasoning folded apart from the answer, the thinking switch."""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from server_helpers import MODEL_NAME, Served, tiny_checkpoint

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# Chromium on these machines: no sandbox as root, no GPU, and no background connections (the network is closed)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1200,900"]
# Records every text the answer and reasoning elements show, so the test can see that the reply came in pieces.
RECORD = """
window.__seen = {answer: [], reasoning: []};
new MutationObserver(() => {
  const last = [...document.querySelectorAll('.msg.assistant')].pop();
  if (!last) return;
  for (const [key, sel] of [['answer', '.answer'], ['reasoning', '.reasoning-text']]) {
    const el = last.querySelector(sel);
    const seen = window.__seen[key];
    if (el && el.textContent !== seen[seen.length - 1]) seen.push(el.textContent);
  }
}).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tiny_checkpoint(tmp_path_factory), max_model_len=512, max_num_seqs=2, enable_prefix_caching=False)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None or DRIVER is None:
        message = "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run installs them")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def send_and_wait(browser, served, text: str, thinking: bool, max_tokens: int):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(served.url + "/")
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "#model option"))
    box = browser.find_element(By.ID, "thinking")
    if box.is_selected() != thinking:
        box.click()
    browser.find_element(By.ID, "temperature").send_keys("0")
    tokens = browser.find_element(By.ID, "max-tokens")
    tokens.clear()
    tokens.send_keys(str(max_tokens))
    browser.execute_script(RECORD)
    browser.find_element(By.ID, "input").send_keys(text)
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 60).until(
        lambda d: d.execute_script("const m = [...document.querySelectorAll('.msg.assistant')].pop();"
                                   "return m && m.dataset.done === '1';"))
    bubble = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    return bubble, browser.execute_script("return window.__seen;")


def test_the_page_is_served(served):
    r = httpx.get(served.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in r.text and "enable_thinking" in r.text


def test_reply_streams_in_and_matches_the_api(browser, served):
    from selenium.webdriver.common.by import By

    bubble, seen = send_and_wait(browser, served, "Hello there", thinking=False, max_tokens=16)
    answer = bubble.find_element(By.CSS_SELECTOR, ".answer").get_attribute("textContent")
    api = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello there"}], "temperature": 0,
        "max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert answer == api["choices"][0]["message"]["content"] and answer
    assert len(seen["answer"]) > 2, seen  # it grew piece by piece
    assert not bubble.find_element(By.CSS_SELECTOR, "details.reasoning").is_displayed()
    assert "finish: length" in bubble.find_element(By.CSS_SELECTOR, ".stats").text


def test_reasoning_is_folded_apart_from_the_answer(browser, served):
    from selenium.webdriver.common.by import By

    served.force("I should greet back, briefly and kindly.\n</think>\n\nHello to you too!")
    try:
        bubble, seen = send_and_wait(browser, served, "Hi!", thinking=True, max_tokens=64)
    finally:
        served.force(None)
    details = bubble.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.is_displayed() and details.get_attribute("open") is None  # folded
    assert details.find_element(By.TAG_NAME, "summary").text == "Reasoning"
    reasoning = bubble.find_element(By.CSS_SELECTOR, ".reasoning-text").get_attribute("textContent")
    assert reasoning == "I should greet back, briefly and kindly."
    assert bubble.find_element(By.CSS_SELECTOR, ".answer").text == "Hello to you too!"
    assert len(seen["reasoning"]) > 2 and len(seen["answer"]) > 2, seen
    assert served.idle_and_free()
