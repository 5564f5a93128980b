"""Objects that hold a token show none of it in their repr: a `%r` in a log line or an
assertion message, or a traceback printer that shows objects by repr, would otherwise print it.
(A printer of every frame's locals shows the token's own string variables too: the operator
has none.)"""

from __future__ import annotations

from typing import Any, cast

import pytest

from servegraph.operator.run.app import EventsToken
from servegraph.operator.secrets import SecretKeyRef
from servegraph.raydash.dashboard import RayDashboard
from servegraph.source import FetchRequest

TOKEN = "tok-4f1e-never-printed"


@pytest.mark.parametrize(
    "holder",
    [
        FetchRequest(url="https://registry.example/g", token=TOKEN),
        EventsToken(kube=cast(Any, None), ref=SecretKeyRef("ns", "events", "token"), value=TOKEN),
        RayDashboard("http://127.0.0.1:8265", TOKEN),
    ],
    ids=lambda h: type(h).__name__,
)
def test_a_token_holder_does_not_show_the_token(holder: object) -> None:
    assert TOKEN not in repr(holder) and TOKEN not in str(holder)
    assert TOKEN in repr(vars(holder)), "the holder does keep the token: the check reads something"
