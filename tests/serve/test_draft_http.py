"""A draft model over HTTP, as llama.cpp's own tests/unit/test_speculative.py asks it: the same
/completion tokens with and without the draft (sampled and seeded), ``timings.draft_n`` and
``draft_n_accepted``, /slots' ``speculative`` and /metrics' spec_decode counters."""

from __future__ import annotations

import pytest

from deployments.serve import engines

from ..draft_models import build_truncated_draft
from ..local_graph import local_graph

# test_speculative.py's request
BODY = {"prompt": "I believe the meaning of life is", "temperature": 0.2, "top_k": 5,
        "seed": 4242, "n_predict": 16, "return_tokens": True}


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> str:
    return str(build_truncated_draft(tmp_path_factory.mktemp("draft")))


def test_with_and_without_a_draft_model(draft):
    with local_graph({"metrics": True}, engine=engines.mlx_engine) as client:
        plain = client.post("/completion", json=BODY).json()
        assert client.get("/slots").json()[0]["speculative"] is False
    settings = {"metrics": True, "model_draft": draft, "spec_type": "draft-simple",
                "spec_draft_n_min": 1, "spec_draft_n_max": 8, "spec_pace": False}
    with local_graph(settings, engine=engines.mlx_engine) as client:
        answers = [client.post("/completion", json={**BODY, "n_predict": n}).json()
                   for n in (16, 64)]
        slots = client.get("/slots").json()
        metrics = client.get("/metrics").text
    assert answers[0]["tokens"] == plain["tokens"]
    assert "draft_n" not in plain["timings"]
    timings = [a["timings"] for a in answers]
    assert all(t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"] for t in timings)
    assert all(s["speculative"] is True for s in slots)
    counters = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("llamacpp:spec_decode")}
    assert counters["llamacpp:spec_decode_num_draft_tokens_total"] == sum(
        t["draft_n"] for t in timings)
    assert counters["llamacpp:spec_decode_num_accepted_tokens_total"] == sum(
        t["draft_n_accepted"] for t in timings)


def test_the_speculative_kind_is_echoed_in_the_generation_settings(draft):
    settings = {"model_draft": draft, "spec_type": "draft-simple"}
    with local_graph(settings) as client:
        props = client.get("/props").json()
        answer = client.post("/completion", json={"prompt": "x", "n_predict": 2}).json()
    assert props["default_generation_settings"]["params"]["speculative.types"] == "draft-simple"
    assert answer["generation_settings"]["speculative.types"] == "draft-simple"
    with local_graph() as client:
        assert client.get("/props").json()["default_generation_settings"]["params"][
            "speculative.types"] == "none"
