"""RayService names claimed by ServeGraphs: one holder per name, released on rename and deletion,
and claiming costs the same with ten thousand ServeGraphs as with one."""

from __future__ import annotations

import time

from servegraph.operator.cache import WatchCache


def body(name: str, namespace: str = "ns") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}


def test_a_name_has_one_holder_until_it_renames_or_goes() -> None:
    cache = WatchCache()
    a, b = cache.put_servegraph(body("a")), cache.put_servegraph(body("b"))
    assert cache.claim(("ns", "x"), a) is None
    assert cache.claim(("ns", "x"), b) == a, "held by a"
    assert cache.claim(("ns", "y"), a) is None  # a now renders y: x is free
    assert cache.claim(("ns", "x"), b) is None
    assert cache.claim(("ns", "x"), a) == b
    cache.forget_servegraph(b)
    assert cache.claim(("ns", "x"), a) is None, "b's claim went with it"
    cache.forget_servegraph(a)
    assert cache.sizes()["claims"] == 0


def test_a_claim_left_by_a_servegraph_no_longer_known_is_taken_over_and_released_once() -> None:
    cache = WatchCache()
    a, b = cache.put_servegraph(body("a")), cache.put_servegraph(body("b"))
    cache.claim(("ns", "x"), a)
    del cache._bodies[a]  # gone without its deletion being seen
    assert cache.claim(("ns", "x"), b) is None
    cache.forget_servegraph(a)
    assert cache.claim(("ns", "x"), a) == b, "a's forgetting does not release b's claim"
    cache.forget_servegraph(b)
    assert cache.sizes()["claims"] == 0


def test_claiming_does_not_scan_every_claim() -> None:
    def per_claim(count: int) -> float:
        cache = WatchCache()
        keys = [cache.put_servegraph(body(f"sg-{i}")) for i in range(count)]
        for key in keys:
            cache.claim(key, key)
        start = time.perf_counter()
        for _ in range(20):
            for key in keys[:200]:
                cache.claim(key, key)
        return (time.perf_counter() - start) / 4000

    small, large = per_claim(200), per_claim(20_000)
    assert large < 10 * small + 2e-6, f"{large * 1e6:.2f} µs per claim at 20,000 against {small * 1e6:.2f} at 200"
