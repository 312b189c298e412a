"""The README's DeploymentHandle example, run against the session's graph."""

from __future__ import annotations

import json


def test_readme_handle_example(base_url):
    from ray import serve

    from deployments.schema import CompletionParams

    shaper = serve.get_deployment_handle("ResponseShaper", app_name="conformance")
    params = CompletionParams(n_predict=8, temperature=0.0, cache_prompt=False)
    status, body = shaper.complete.remote(params, [[0, 317, 523, 264]]).result()
    assert status == 200
    assert json.loads(body)["content"] == "():\n    return codecs."
