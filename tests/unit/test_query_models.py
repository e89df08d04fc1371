"""A route's query parameters, read once through its model (proxy/api/query.py): each refusal is the
house's 400 naming the parameter, in the words the routes have always used, and a parameter given
twice is read as its first."""

from __future__ import annotations

import pytest

REFUSED = [
    ("/v1/sessions?limit=0", "limit", "'limit' must be an integer from 1 to 500, in ASCII digits."),
    ("/v1/sessions?limit=%EF%BC%95", "limit", "'limit' must be an integer from 1 to 500, in ASCII digits."),  # "５"
    ("/v1/sessions?since=soon", "since", "'since' must be Unix seconds or an ISO 8601 time."),
    ("/v1/sessions?until=99999999999", "until",
     "'until' must be Unix seconds or an ISO 8601 time between 1970 and 2262."),
    ("/v1/sessions?before=12", "before", "'before' must be the 'next' value of a previous page."),
    ("/v1/traces?limit=1001", "limit", "'limit' must be an integer from 1 to 1000, in ASCII digits."),
    ("/v1/traces?before=x:y", "before", "'before' must be the 'next' value of a previous page."),
    ("/v1/sessions/some-key?offset=-1", "offset",
     "'offset' must be an integer from 0 to 2147483648, in ASCII digits."),
    ("/v1/sessions/some-key?limit=10001", "limit", "'limit' must be an integer from 1 to 10000, in ASCII digits."),
    ("/v1/sessions/", "key", "Name the session: /v1/sessions/{key}, or /v1/sessions/?key=KEY."),
    ("/v1/erasures?limit=0", "limit", "'limit' must be an integer from 1 to 10000, in ASCII digits."),
    ("/v1/rollouts?limit=1001", "limit", "'limit' must be an integer from 1 to 1000, in ASCII digits."),
    ("/v1/rollouts/r-1/gap?cap=1", "cap", "'cap' must be a number above 1 (an importance ratio's cap), at most 1000."),
]


@pytest.mark.parametrize(("path", "param", "message"), REFUSED, ids=[p for p, _, _ in REFUSED])
def test_a_bad_parameter_is_the_houses_400_naming_it(replay_app, path, param, message):
    status, answer = replay_app.call("GET", path)
    assert status == 400, answer
    assert answer["error"] == {"message": message, "type": "invalid_request_error", "param": param,
                               "code": "invalid_value"}, answer


def test_an_erasure_names_its_session(replay_app):
    status, answer = replay_app.call("DELETE", "/v1/sessions/?limit=nope")
    assert status == 400, answer
    assert answer["error"]["message"] == "Name the session: DELETE /v1/sessions/{key}, or /v1/sessions/?key=KEY."


def test_a_parameter_given_twice_is_read_as_its_first(replay_app):
    status, page = replay_app.call("GET", "/v1/sessions?limit=2&limit=nope")
    assert status == 200 and page["object"] == "list", page
    status, answer = replay_app.call("GET", "/v1/sessions?limit=nope&limit=2")
    assert status == 400 and answer["error"]["param"] == "limit", answer


def test_parameters_a_route_does_not_name_are_ignored(replay_app):
    status, page = replay_app.call("GET", "/v1/traces?limit=3&colour=blue&since=")
    assert status == 200 and page["object"] == "list" and len(page["data"]) <= 3, page
