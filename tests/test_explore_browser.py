"""`bertkit explore` in a real browser: headless Chromium, driven by Selenium, on the live page.

Tiny random models with the MiniLM vocabulary (a masked LM and one model per task use) are served
by the explorer's own app under uvicorn on 127.0.0.1; the test opens the page, goes through every
view with clicks and key presses, and checks that the DOM shows the numbers the library computes
for the same text (fill-mask's top-5 equal `bertkit.inference.fill_mask`'s, the classifier's bars
equal `classify`'s, ...). The page puts each exact value in a data-* attribute and the formatted
one (4 decimals for probabilities) in the text, so both are checked. A screenshot of each view
goes to the test's tmp dir, and to $BERTKIT_SCREENSHOTS when set (for the README).
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import httpx
import pytest

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM
from bertkit.explore import Explorer, build_app
from bertkit.inference import classify, fill_mask, ner, qa, rerank, similarity

from model_fixtures import save_tiny
from web_fixtures import running_app

try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    pytest.skip("needs selenium: pip install selenium (it is in the test extra)", allow_module_level=True)

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").is_file() else shutil.which("chromedriver")
if not CHROMIUM or not CHROMEDRIVER:
    pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; "
                ".ci/run installs them)", allow_module_level=True)


WAIT = 20  # seconds: the slowest step (the first request loads nothing, but CI machines are slow)
POLL = 0.05  # seconds between looks at the page while waiting (Selenium's 0.5 s adds ~0.5 s to each step)


@pytest.fixture(scope="module")
def dirs(minilm_dir, tmp_path_factory):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    root = tmp_path_factory.mktemp("explore-browser")
    return {"mlm": save_tiny(BertForMaskedLM, tokenizer, root / "mlm"),
            "clf": save_tiny(BertForSequenceClassification, tokenizer, root / "clf", seed=1,
                         id2label={0: "neg", 1: "neu", 2: "pos"}),
            "ner": save_tiny(BertForTokenClassification, tokenizer, root / "ner", seed=2,
                         id2label={0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}),
            "qa": save_tiny(BertForQuestionAnswering, tokenizer, root / "qa", seed=3),
            "rr": save_tiny(BertForSequenceClassification, tokenizer, root / "rr", seed=4, id2label={0: "LABEL_0"}),
            "minilm": Path(minilm_dir)}


@pytest.fixture(scope="module")
def explorer(dirs) -> Explorer:
    return Explorer.load(dirs["mlm"], [("sentiment", dirs["clf"]), ("people", dirs["ner"]),
                                       ("reader", dirs["qa"]), ("ranker", dirs["rr"]),
                                       ("sentences", dirs["minilm"])])


@pytest.fixture(scope="module")
def base_url(explorer):
    with running_app(build_app(explorer), WAIT) as url:
        yield url


@pytest.fixture(scope="module")
def api(base_url):
    with httpx.Client(base_url=base_url, timeout=WAIT) as client:
        def call(path, payload=None):
            response = client.get(path) if payload is None else client.post(path, json=payload)
            assert response.status_code == 200, response.text
            return response.json()
        yield call


@pytest.fixture(scope="module")
def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.set_script_timeout(WAIT)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def page(driver, base_url):
    driver.get(base_url + "/")
    WebDriverWait(driver, WAIT, POLL).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
    yield driver
    # A script error or a failed load of an asset is a bug; the 422 the fill-mask test asks for is not.
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
              and not (e["source"] == "network" and "status of 422" in e["message"])]
    assert not errors, f"the page logged errors: {errors}"


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where screenshots go: the tmp dir always, $BERTKIT_SCREENSHOTS too when set."""
    dirs = [tmp_path_factory.mktemp("screenshots")]
    if os.environ.get("BERTKIT_SCREENSHOTS"):
        dirs.append(Path(os.environ["BERTKIT_SCREENSHOTS"]))
        dirs[-1].mkdir(parents=True, exist_ok=True)
    return dirs


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def prob(p: float) -> str:
    return f"{p:.4f}"


def view(driver, name: str):
    return driver.find_element(By.CSS_SELECTOR, f'[data-testid="view-{name}"]')


def settled(driver, root, done_before: int):
    """Wait until the view finished a run after `done_before` runs, and check it did not fail."""
    def finished(_):
        done = int(root.get_attribute("data-done") or 0)
        return done > done_before and root.get_attribute("data-state") != "loading"
    try:
        WebDriverWait(driver, WAIT, POLL).until(finished)
    except TimeoutException:
        raise AssertionError(f"{root.get_attribute('data-testid')} did not finish: "
                             f"state {root.get_attribute('data-state')}") from None
    status = driver.find_element(By.ID, "status")
    assert root.get_attribute("data-state") == "ready", f"the page reported: {status.text}"


def done(root) -> int:
    return int(root.get_attribute("data-done") or 0)


def act(driver, root, action):
    """Do `action` (a click, a key press) and wait for the view's answer."""
    before = done(root)
    action()
    settled(driver, root, before)


def open_view(driver, name: str):
    root = view(driver, name)
    first = root.get_attribute("data-done") is None
    driver.find_element(By.CSS_SELECTOR, f'[data-testid="tab-{name}"]').click()
    assert root.is_displayed()
    if first:
        settled(driver, root, 0)
    return root


def all_of(root, testid: str):
    return root.find_elements(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def attributes(root, testid: str, *names: str) -> list[list[str | None]]:
    """The attributes `names` of each element `all_of(root, testid)` finds, in one script: a
    heatmap has hundreds of cells, and each get_attribute is a round trip to the browser."""
    return root.parent.execute_script(
        "return Array.from(arguments[0].querySelectorAll(arguments[1]),"
        " e => arguments[2].map(n => e.getAttribute(n)));",
        root, f'[data-testid="{testid}"]', list(names))


def screenshot(driver, shots, name: str):
    """The whole page (beyond the window's height) as PNG, via Chromium's DevTools protocol."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.execute_script("return document.documentElement.scrollWidth")
    png = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
    for folder in shots:
        (folder / f"explore-{name}.png").write_bytes(base64.b64decode(png["data"]))


def set_text(field, value: str):
    field.clear()
    field.send_keys(value)


# ---------------------------------------------------------------------------------------------
# the views
# ---------------------------------------------------------------------------------------------
def test_tabs_are_keyboard_usable_and_the_header_names_the_model(page, api):
    info = api("/api/info")
    assert info["model"]["name"] in page.find_element(By.CSS_SELECTOR, '[data-testid="model-line"]').text
    tab = page.find_element(By.CSS_SELECTOR, '[data-testid="tab-visibility"]')
    tab.click()
    tab.send_keys(Keys.ARROW_RIGHT)  # arrows move along the tab list, as ARIA's tabs pattern says
    assert page.switch_to.active_element.get_attribute("data-testid") == "tab-assembly"
    assert view(page, "assembly").is_displayed() and not view(page, "visibility").is_displayed()
    assert page.execute_script("return getComputedStyle(document.activeElement).outlineStyle") == "solid"  # focus shows
    page.switch_to.active_element.send_keys(Keys.ARROW_LEFT)
    assert view(page, "visibility").is_displayed()


def test_visibility_shows_both_masks_and_the_leak(page, api, shots):
    root = open_view(page, "visibility")
    text = root.find_element(By.ID, "vis-text").get_attribute("value")
    data = api("/api/visibility", {"text": text, "position": 3})
    act(page, root, lambda: all_of(root, "visibility-gpt-token")[3].click())
    bert, gpt = all_of(root, "visibility-bert-token"), all_of(root, "visibility-gpt-token")
    assert [b.find_element(By.CLASS_NAME, "token-text").text for b in bert] == data["tokens"]
    assert [b.get_attribute("data-visible") for b in bert] == ["1"] * len(data["tokens"])
    assert [b.get_attribute("data-visible") for b in gpt] == [str(v) for v in data["gpt"][3]]
    assert root.find_element(By.CSS_SELECTOR, '[data-testid="visibility-gpt-count"]').text == "4"
    gpt_cells = all_of(root, "visibility-gpt-cell")
    assert len(gpt_cells) == len(data["tokens"]) ** 2
    cards = all_of(root, "objective")
    assert [c.get_attribute("data-leak") for c in cards] == ["false", "false", "true"]
    assert [len(all_of(c, "leak-badge")) for c in cards] == [0, 0, 1]
    for card, objective in zip(cards, data["objectives"]):
        shown = card.find_element(By.CSS_SELECTOR, '[data-testid="objective-prob"]').text
        assert shown == prob(objective["prob"]) if objective["prob"] is not None else shown.startswith("—")
    screenshot(page, shots, "1-visibility")


def test_assembly_shows_the_models_own_table_rows(page, api, explorer, shots):
    root = open_view(page, "assembly")
    text = root.find_element(By.ID, "asm-text").get_attribute("value")
    pair = root.find_element(By.ID, "asm-pair").get_attribute("value")
    act(page, root, lambda: all_of(root, "assembly-token")[2].click())
    data = api("/api/assembly", {"text": text, "pair": pair, "position": 2})
    assert [c.text for c in all_of(root, "assembly-segment")] == [str(s) for s in data["segments"]]
    assert [c.text for c in all_of(root, "assembly-id")] == [str(i) for i in data["ids"]]
    assert 1 in data["segments"]  # the pair is a second segment
    rows = {r.get_attribute("data-kind"): r for r in all_of(root, "assembly-vector")}
    own_row = explorer.encoder.embeddings.word_embeddings.weight[data["ids"][2]].detach()
    for kind, row in rows.items():
        assert float(row.get_attribute("data-norm")) == pytest.approx(data["norms"][kind], abs=1e-9)
        dims = [float(c.get_attribute("data-value")) for c in all_of(row, "assembly-dim")]
        assert dims == pytest.approx(data["vectors"][kind][:8], abs=1e-9)
        assert [c.text for c in all_of(row, "assembly-dim")] == [f"{x:.3f}" for x in data["vectors"][kind][:8]]
    token_dims = [float(c.get_attribute("data-value")) for c in all_of(rows["token"], "assembly-dim")]
    assert token_dims == pytest.approx(own_row[:8].tolist(), abs=1e-6)  # the token table's own row
    info = api("/api/info")
    assert len(all_of(root, "parameter-row")) == len(info["model"]["parameters"])
    assert root.find_element(By.CSS_SELECTOR, '[data-testid="embedding-share"]').text == \
        f"{100 * info['model']['embedding_share']:.2f}%"
    screenshot(page, shots, "2-assembly")


def check_masking(root, data):
    selected = [position for position, chosen in attributes(root, "masking-token", "data-position", "data-selected")
                if chosen == "true"]
    assert selected == [str(i) for i, k in enumerate(data["kinds"]) if k]
    inputs = all_of(root, "masking-input")
    assert [t.find_element(By.CLASS_NAME, "token-text").text for t in inputs] == data["input_tokens"]
    assert [t.find_element(By.CLASS_NAME, "token-text").text for t in all_of(root, "masking-label")] == \
        [str(x) for x in data["labels"]]
    rows = all_of(root, "masking-prediction")
    assert [int(position) for position, in attributes(root, "masking-prediction", "data-position")] == \
        [p["position"] for p in data["predictions"]]
    for row, expected in zip(rows, data["predictions"]):
        top = all_of(row, "masking-top")
        tokens_scores = attributes(row, "masking-top", "data-token", "data-score")
        assert [token for token, _ in tokens_scores] == [c["token"] for c in expected["top"]]
        assert [float(score) for _, score in tokens_scores] == [c["score"] for c in expected["top"]]
        assert [t.find_element(By.CLASS_NAME, "num").text for t in top] == [prob(c["score"]) for c in expected["top"]]
        shown = row.find_element(By.CSS_SELECTOR, '[data-testid="masking-prob-true"]').text
        assert shown == prob(expected["prob_true"])
    assert root.find_element(By.CSS_SELECTOR, '[data-testid="masking-loss"]').text == f"{data['loss']:.4f}"


def test_masking_shows_the_draw_and_the_models_guesses(page, api, shots):
    root = open_view(page, "masking")
    text_box = root.find_element(By.ID, "mask-text")
    long_text = "the central bank raised interest rates by a quarter of a point, and the markets fell sharply."
    act(page, root, lambda: (set_text(text_box, long_text), text_box.find_element(By.XPATH, "ancestor::form").submit()))
    check_masking(root, api("/api/masking", {"text": long_text, "seed": 0, "whole_word": False}))
    act(page, root, lambda: root.find_element(By.CSS_SELECTOR, '[data-testid="masking-reseed"]').click())
    assert root.find_element(By.ID, "mask-seed").get_attribute("value") == "1"
    check_masking(root, api("/api/masking", {"text": long_text, "seed": 1, "whole_word": False}))
    whole_word = root.find_element(By.CSS_SELECTOR, '[data-testid="masking-whole-word"]')
    act(page, root, lambda: whole_word.send_keys(Keys.SPACE))
    check_masking(root, api("/api/masking", {"text": long_text, "seed": 1, "whole_word": True}))
    screenshot(page, shots, "3-masking")
    chinese = "北京是中国的首都，也是全国的政治和文化中心。"  # jieba's words are shown under the tokens
    act(page, root, lambda: (set_text(text_box, chinese), text_box.find_element(By.XPATH, "ancestor::form").submit()))
    data = api("/api/masking", {"text": chinese, "seed": 1, "whole_word": True})
    assert data["words"] and [w.text for w in root.find_elements(
        By.CSS_SELECTOR, '[data-testid="masking-words"] .word')] == data["words"]
    check_masking(root, data)


def check_fill_mask(root, texts, dirs):
    expected = fill_mask(dirs["mlm"], texts, top_k=5)  # the library on its own, as `bertkit fill-mask`
    columns = all_of(root, "fillmask-result")
    assert len(columns) == len(texts)
    for column, masks in zip(columns, expected):
        rows = all_of(column, "fillmask-row")
        (candidates,) = masks
        assert [r.get_attribute("data-token") for r in rows] == [c.token for c in candidates]
        shown = [float(r.get_attribute("data-score")) for r in rows]
        assert shown == pytest.approx([c.score for c in candidates], abs=1e-6)
        assert [r.find_element(By.CSS_SELECTOR, '[data-testid="fillmask-score"]').text for r in rows] == \
            [prob(c.score) for c in candidates]


def test_fill_mask_equals_the_library(page, dirs, shots):
    root = open_view(page, "fillmask")
    texts = [root.find_element(By.ID, i).get_attribute("value") for i in ("fm-a", "fm-b")]
    check_fill_mask(root, texts, dirs)
    new = ["paris is the [MASK] of france.", "the [MASK] is full of water."]
    for box, value in zip(("fm-a", "fm-b"), new):
        set_text(root.find_element(By.ID, box), value)
    act(page, root, lambda: root.find_element(By.ID, "fm-b").find_element(By.XPATH, "ancestor::form").submit())
    check_fill_mask(root, new, dirs)
    screenshot(page, shots, "4-fillmask")
    # The server's own error message reaches the page's status area, and the numbers stay as they were.
    set_text(root.find_element(By.ID, "fm-a"), "no slot in this one")
    before = done(root)
    root.find_element(By.ID, "fm-a").find_element(By.XPATH, "ancestor::form").submit()
    WebDriverWait(page, WAIT, POLL).until(lambda _: done(root) > before)
    assert root.get_attribute("data-state") == "error"
    status = page.find_element(By.CSS_SELECTOR, '[data-testid="status"]')
    assert status.get_attribute("data-kind") == "error" and "has no [MASK] token" in status.text
    check_fill_mask(root, new, dirs)


def cells(root, testid):
    """{(row, col): value} of one heatmap's cells."""
    return {(int(row), int(col)): float(value)
            for row, col, value in attributes(root, testid, "data-row", "data-col", "data-value")}


def test_attention_grid_head_and_padding_panel(page, api, shots):
    root = open_view(page, "attention")
    text = root.find_element(By.ID, "att-text").get_attribute("value")
    data = api("/api/attention", {"text": text, "pad": 4, "layer": 1, "head": 2})
    thumbs = all_of(root, "attention-thumb")
    assert len(thumbs) == data["layers"] * data["heads"]
    (thumb,) = [t for t in thumbs if (t.get_attribute("data-layer"), t.get_attribute("data-head")) == ("1", "2")]
    act(page, root, lambda: thumb.send_keys(Keys.ENTER))
    head = root.find_element(By.CSS_SELECTOR, '[data-testid="attention-head"]')
    assert (head.get_attribute("data-layer"), head.get_attribute("data-head")) == ("1", "2")
    n = len(data["tokens"])
    weights = data["attention"][1][2]
    assert cells(root, "attention-cell") == {(i, j): weights[i][j] for i in range(n) for j in range(n)}
    padding = data["padding"]
    assert (padding["layer"], padding["head"]) == (1, 2)
    for testid, key in (("padding-with-cell", "with_mask"), ("padding-without-cell", "without_mask"),
                        ("padding-score-cell", "scores")):
        assert cells(root, testid) == {(i, j): v for i, row in enumerate(padding[key]) for j, v in enumerate(row)}
    assert root.find_element(By.CSS_SELECTOR, '[data-testid="padding-mass-with"]').text == "0.0000"
    without = sum(sum(row[padding["real"]:]) for row in padding["without_mask"]) / padding["real"]
    assert root.find_element(By.CSS_SELECTOR, '[data-testid="padding-mass-without"]').text == prob(without)
    assert without > 0  # forgetting the mask sends weight to [PAD]
    screenshot(page, shots, "5-attention")
    act(page, root, lambda: root.find_element(By.CSS_SELECTOR, '[data-testid="attention-hide-special"]').click())
    kept = [i for i in range(n) if not data["special"][i]]
    assert cells(root, "attention-cell") == {(i, j): weights[i][j] for i in kept for j in kept}
    query = all_of(root, "attention-query")[0]
    assert int(query.get_attribute("data-position")) == kept[0]
    query.click()
    assert all_of(root, "attention-query")[0].get_attribute("aria-pressed") == "true"


def test_tasks_show_each_models_answer(page, dirs, explorer, shots):
    root = open_view(page, "tasks")
    cards = {c.get_attribute("data-testid")[len("task-"):]: c for c in root.find_elements(
        By.CSS_SELECTOR, "[data-use]")}
    assert sorted(cards) == sorted(explorer.tasks)
    inputs = {name: [f.get_attribute("value") for f in card.find_elements(By.CSS_SELECTOR, "input, textarea")]
              for name, card in cards.items()}

    text, _ = inputs["sentiment"]
    (expected,) = classify(dirs["clf"], [text])
    rows = all_of(cards["sentiment"], "task-classify-row")
    assert {r.get_attribute("data-label"): r.find_element(By.CSS_SELECTOR, '[data-testid="task-classify-prob"]').text
            for r in rows} == {label: prob(p) for label, p in expected["scores"].items()}
    assert {r.get_attribute("data-label"): float(r.get_attribute("data-prob")) for r in rows} == \
        pytest.approx(expected["scores"], abs=1e-6)
    assert cards["sentiment"].find_element(By.CSS_SELECTOR, '[data-testid="task-label"]').text == expected["label"]

    (entities,) = ner(dirs["ner"], inputs["people"])
    marks = all_of(cards["people"], "task-ner-entity")
    assert [(int(m.get_attribute("data-start")), int(m.get_attribute("data-end")), m.get_attribute("data-type"))
            for m in marks] == [(e["start"], e["end"], e["type"]) for e in entities]  # spans do not overlap

    question, context = inputs["reader"]
    best = qa(dirs["qa"], [question], [context], top_k=3)[0][0]
    answer = cards["reader"].find_element(By.CSS_SELECTOR, '[data-testid="task-qa-answer"]')
    shown = (int(answer.get_attribute("data-start")), int(answer.get_attribute("data-end")))
    assert shown == (best["start"], best["end"])
    assert answer.text.startswith(context[best["start"]:best["end"]].strip())

    query, documents = inputs["ranker"]
    ranked = rerank(dirs["rr"], query, [d for d in documents.split("\n") if d.strip()])
    rows = all_of(cards["ranker"], "task-rerank-row")
    assert [int(r.get_attribute("data-index")) for r in rows] == [r["index"] for r in ranked]
    assert [float(r.get_attribute("data-score")) for r in rows] == pytest.approx([r["score"] for r in ranked], abs=1e-6)

    sentences = [s for s in inputs["sentences"][0].split("\n") if s.strip()]
    matrix = similarity(dirs["minilm"], sentences)
    assert cells(cards["sentences"], "task-embed-cell") == pytest.approx(
        {(i, j): float(matrix[i, j]) for i in range(len(sentences)) for j in range(len(sentences))}, abs=1e-5)
    screenshot(page, shots, "6-tasks")


def test_every_control_is_labelled_and_every_token_a_button(page):
    # After the views above: every view is built by now.
    ids = [e.get_attribute("id") for e in page.find_elements(By.CSS_SELECTOR, "input, textarea")]
    assert len(ids) > 15 and len(set(ids)) == len(ids) and all(ids)
    for i in ids:
        assert page.find_elements(By.CSS_SELECTOR, f'label[for="{i}"]'), f"no label for #{i}"
    pickable = page.find_elements(By.CSS_SELECTOR, ", ".join(f'[data-testid="{t}"]' for t in (
        "visibility-bert-token", "visibility-gpt-token", "assembly-token", "attention-thumb", "attention-query")))
    pickable += page.find_elements(By.CSS_SELECTOR, '[role="tab"]')
    assert pickable and {e.tag_name for e in pickable} == {"button"}


def test_a_model_without_mlm_head_says_so(driver, dirs, page):
    # page: runs first, so its console check covers the main page; this one opens another server.
    with running_app(build_app(Explorer.load(dirs["minilm"])), WAIT) as url:
        driver.get(url + "/#fillmask")
        WebDriverWait(driver, WAIT, POLL).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        root = view(driver, "fillmask")
        assert "no masked-LM head" in root.find_element(By.CSS_SELECTOR, '[data-testid="no-mlm"]').text
        assert not all_of(root, "fillmask-row")
        root = open_view(driver, "masking")
        assert root.find_elements(By.CSS_SELECTOR, '[data-testid="no-mlm"]')
        assert not all_of(root, "masking-top")
