"""Routes of llama-server's surface on stand-in replicas, without Ray: slot file names, 503 while
the model loads, ``fail_on_no_slot``."""

from __future__ import annotations

import asyncio

import pytest

from deployments.serve.routes import info, unsupported


@pytest.mark.parametrize("name", ["ok.bin", "slot-0_save", "a b"])
def test_valid_filenames(name):
    assert info.valid_filename(name)


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "x:y",
                                  "nul\x00", "a" * 256])
def test_invalid_filenames(name):
    assert not info.valid_filename(name)


class _LoadingReplica:
    class _Ready:
        async def remote(self):
            return False

    ready = _Ready()


def ingress_over(replica, ready: bool, args=None):
    """An ingress of one model on a stand-in replica, without Ray."""
    from deployments.serve.endpoint import IngressBase, ModelEndpoint

    model = object.__new__(ModelEndpoint)
    model.replica, model._ready, model.args = replica, ready, args
    ingress = object.__new__(IngressBase)
    ingress.models, ingress.by_name, ingress.args = [model], {}, args
    ingress.api_keys, ingress.board, ingress.router = [], None, None
    return ingress


@pytest.mark.parametrize("handler", [info.props, info.models, info.slots, info.metrics,
                                     unsupported.not_supported])
def test_loading_is_503_on_every_route(handler):
    from deployments.api.errors import ApiError

    ingress = ingress_over(_LoadingReplica(), ready=False)
    with pytest.raises(ApiError) as err:
        asyncio.run(handler(ingress, None))
    assert err.value.code == 503
    assert err.value.body() == {"error": {"message": "Loading model",
                                          "type": "unavailable_error", "code": 503}}


class _BusyReplica:
    """Every slot processing: what /slots?fail_on_no_slot=1 refuses."""

    class _Ask:
        async def remote(self, what):
            assert what == "slot_states"
            states = [{"id": i, "n_ctx": 2048, "is_processing": True, "task": None}
                      for i in range(2)]
            return {"identity": {"replica": "r", "node": "n", "rank": 0}, "answer": states}

    ask = _Ask()


def test_fail_on_no_slot_is_503_when_all_slots_are_busy():
    from types import SimpleNamespace

    from deployments.api.errors import ApiError

    ingress = ingress_over(_BusyReplica(), True, SimpleNamespace(slots=True, api_key=None,
                                                               n_parallel=2))
    request = SimpleNamespace(query_params={"fail_on_no_slot": "1"},
                              url=SimpleNamespace(path="/slots"), method="GET", headers={})
    with pytest.raises(ApiError) as err:
        asyncio.run(info.slots(ingress, request))
    assert (err.value.code, err.value.message) == (503, "no slot available")
    request.query_params = {}
    assert asyncio.run(info.slots(ingress, request)).status_code == 200
