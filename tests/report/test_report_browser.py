"""report.html (and the dashboard) in headless Chromium with script and markup in the data.

A run directory is built without an engine (tests/support/fakes.py): the task's data text (the
prompts' questions and targets) and the model's outputs (responses, extracted answers,
token texts) carry the payloads of tests/support/payloads.py. The comparison and report.html
are the real ones. In the browser nothing may run (``window.__pwned``, the title), no
element may come from the data, and every payload must read as text.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from browser import artifact_dir, chromium, full_page_screenshot, severe_console_entries
from dashboard_samples import render, sample_history
from fakes import make_samples, mutate, set_column, set_token, write_run
from payloads import A_TAG, BREAKOUT, CDATA_END, IFRAME, IMG, MD_LINK, SCRIPT, SVG, TEMPLATE, TEXT

from evalpipe.pipeline.comparing import compare_run, write_outputs
from evalpipe.rundir import artifacts

# one payload per document, short enough that no excerpt of the report cuts it
PER_DOC = [SCRIPT, IMG, SVG, IFRAME, A_TAG, BREAKOUT, MD_LINK, TEMPLATE + " " + CDATA_END]
N = len(PER_DOC)

# What only injected markup would create, and script that reports what it finds.
FOREIGN = "script, iframe, svg, object, embed, a, #pwned, #pwned-link, img:not([src^='data:image/png;base64,'])"
HANDLERS = ("return [...document.querySelectorAll('*')]"
            ".flatMap(e => [...e.attributes].filter(a => a.name.startsWith('on')).map(a => e.tagName + ' ' + a.name))")


def _hostile_run(root):
    """Reference and variant disagree on every item (so every item is shown); data and outputs carry payloads."""
    legacy = make_samples(N, scores=[float(i % 2) for i in range(N)])
    for s in legacy:
        s.response = f"The answer is {s.doc_id}. {PER_DOC[s.doc_id]}"
    sp = [s.copy(scores={k: 1.0 - v for k, v in s.scores.items()}, response=f"I think {PER_DOC[s.doc_id]}") for s in legacy]
    sp = mutate(sp, 2, set_token(3, 7))
    run = write_run(root, {"legacy": legacy, "sp": sp}, run_info={"model": {"name": "tiny" + IMG}})
    for name in ("legacy", "sp"):
        vdir = artifacts.RunDir(run).variant(name)
        samples = pq.read_table(vdir.samples)
        # as a data file's text reaches samples.parquet: the prompt (question) and the target
        docs = samples.column("doc_id").to_pylist()
        samples = set_column(samples, "prompt", [f"Question: {PER_DOC[d]}\nAnswer:" for d in docs])
        samples = set_column(samples, "target", [f"42 {PER_DOC[d]}" for d in docs])
        artifacts.write_table(vdir.samples, samples)
        tokens = pq.read_table(vdir.tokens)
        texts = [PER_DOC[(d + p) % N] for d, p in zip(tokens.column("doc_id").to_pylist(), tokens.column("pos").to_pylist())]
        artifacts.write_table(vdir.tokens, set_column(tokens, "token_text", texts))
    write_outputs(run, compare_run(run))
    return run


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


def _assert_nothing_ran(driver, title: str) -> str:
    from selenium.webdriver.common.by import By

    assert driver.execute_script("return [window.__pwned, document.title]") == [None, title]
    assert driver.execute_script(HANDLERS) == []
    severe = severe_console_entries(driver)
    assert severe == [], f"console errors: {severe}"
    return driver.find_element(By.TAG_NAME, "body").text


def test_report_html_in_chromium_runs_no_payload(driver, tmp_path):
    run = _hostile_run(tmp_path / "hostile-run")
    html = (run / artifacts.REPORT_HTML).read_text(encoding="utf-8")
    assert SCRIPT not in html and IMG not in html  # escaped in the file itself
    driver.get((run / artifacts.REPORT_HTML).as_uri())

    body = _assert_nothing_ran(driver, "evalpipe comparison: hostile-run")
    assert driver.execute_script(f"return document.querySelectorAll({FOREIGN!r}).length") == 0
    for payload in PER_DOC:
        assert payload in body, f"not shown literally: {payload!r}"
    assert "tiny" + IMG in body  # run.json text too

    shot = full_page_screenshot(driver, artifact_dir(tmp_path) / "report-hostile.png")
    assert shot.stat().st_size > 10_000


def test_dashboard_in_chromium_runs_no_payload(driver, tmp_path):
    data = sample_history(n_nights=6, change_at=3)
    change = data["changes"][0]
    change["flipped"][0]["prompt"] = TEXT
    change["summary"] = TEXT
    change["bisect"][0]["after"] = TEXT
    data["nights"][-1]["reasons"] = [TEXT]
    data["nights"][-1]["report"] = "javascript:window.__pwned=6"
    page = tmp_path / "dashboard.html"
    artifacts.write_text(page, render(data))
    driver.get(page.as_uri())

    body = _assert_nothing_ran(driver, data["title"])
    # the page's own links (report paths, chart anchors) and charts (an svg per figure) stay
    foreign = "script, iframe, object, embed, img, #pwned, #pwned-link, svg:not(figure.chart > svg)"
    assert driver.execute_script(f"return document.querySelectorAll({foreign!r}).length") == 0
    hrefs = driver.execute_script("return [...document.querySelectorAll('a')].map(a => a.getAttribute('href'))")
    assert hrefs and not [h for h in hrefs if h.lower().lstrip().startswith(("javascript:", "data:"))]
    for payload in (SCRIPT, IMG, SVG, IFRAME, A_TAG, BREAKOUT, MD_LINK, TEMPLATE):
        assert payload in body, f"not shown literally: {payload!r}"


def test_the_sampling_section_reads_in_chromium(driver, tmp_path):
    """A sampled run on the fake engine (a reference, its A/A run and a variant whose distribution
    changes from the 4th token): report.html's sampling section shows the sampler, the variant's
    and the A/A run's divergent samples, the prediction, and pass@k."""
    import in_process
    import yaml
    from selenium.webdriver.common.by import By

    from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV

    config = {
        "model": {"path": "builtin:tiny-gsm"}, "engine": {"max_model_len": 4096}, "output": str(tmp_path / "runs"),
        "noise_floor": True, "sampling": {"temperature": 0.7, "top_p": 0.9, "samples": 2},
        "capture": {"topk": 5, "prompt_positions": {"min_prompt_tokens": 1 << 16}},
        "variants": {"ref": {}, "diverge": {"env": {FAKE_ENGINE_ENV: "diverge=4"}}}, "reference": "ref",
        "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]},
    }
    path = tmp_path / "sampled.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = in_process.evalpipe("run", "gsm8k", "-c", str(path), "--limit", "3", "--run-id", "browser", cwd=tmp_path,
                               env={FAKE_ENGINE_ENV: "1"})
    assert proc.returncode == 1, proc.stdout[-2000:]  # DIVERGENT
    driver.get((tmp_path / "runs" / "browser" / artifacts.REPORT_HTML).as_uri())
    _assert_nothing_ran(driver, "evalpipe comparison: browser")
    (heading,) = driver.find_elements(By.CSS_SELECTOR, "h4.sampling")
    assert heading.text == "Sampled decoding: gsm8k_synth_4shot"
    table = driver.find_element(By.CSS_SELECTOR, "table.sampling")
    rows = {r.find_elements(By.TAG_NAME, "td")[0].text: [c.text for c in r.find_elements(By.TAG_NAME, "td")[1:]]
            for r in table.find_elements(By.TAG_NAME, "tr")[1:]}
    headers = [h.text for h in table.find_elements(By.TAG_NAME, "th")]
    assert headers == ["samples", "diverge", "A/A (ref-aa)"]
    assert rows["samples compared"] == ["6 (3 items × 2)", "6 (3 items × 2)"]
    assert rows["divergent samples"][0].startswith("6/6") and rows["divergent samples"][1].startswith("0/6")
    assert rows["first divergence"][0].startswith("position 4")
    assert rows["divergent samples predicted"][0].startswith("≤ ")
    pass_rows = driver.find_elements(By.CSS_SELECTOR, "table.pass-at tr")
    assert len(pass_rows) == 1 + 2 * 2  # two metrics x k in {1, 2}
    assert "temperature 0.7, top_p 0.9" in driver.find_element(By.TAG_NAME, "body").text
    full_page_screenshot(driver, artifact_dir(tmp_path) / "report-sampled.png")
