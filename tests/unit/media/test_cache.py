"""The prepared-media cache and preparer: LRU retention within --media-cache-mib, all live payloads
within --media-live-mib, leases outliving eviction, single-flight builds, and a soak of mixed
concurrent requests after which nothing is left live but what the LRU retains."""

from __future__ import annotations

import base64
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ninfer.artifact.media_settings import IMAGE_DEFAULTS, VIDEO_DEFAULTS
from ninfer.media.cache import Claim, MediaCache
from ninfer.media.errors import MediaError
from ninfer.media.prepared import PreparedMedia
from ninfer.media.preparer import MediaLimits, MediaPreparer
from ninfer.media.settings import MediaSettings
from ninfer.media.sources import MediaSource
from support.media_files import encode_image, make_video, noise_image

SETTINGS = MediaSettings.from_config(
    {
        "image": {**IMAGE_DEFAULTS, "min_pixels": 4096, "max_pixels": 65536},
        "video": {**VIDEO_DEFAULTS, "min_pixels": 4096, "max_pixels": 65536, "max_frames": 8},
    }
)


def _payload(name: str, nbytes: int) -> PreparedMedia:
    return PreparedMedia("image", torch.zeros(nbytes // 4), (1, 2, 2), 2, digest=name)


def _insert(cache: MediaCache, name: str, nbytes: int) -> PreparedMedia:
    claim = cache.claim((name, "image"))
    assert claim.build is not None
    payload = _payload(name, nbytes)
    cache.finish(claim, payload, None)
    return claim.build.result()


def test_lru_retention_and_leases_outlive_eviction() -> None:
    cache = MediaCache(cache_bytes=300, live_bytes=1000)
    a = _insert(cache, "a", 100)
    b = _insert(cache, "b", 100)
    _insert(cache, "c", 100)
    for p in (a, b):
        cache.release(p)
    assert cache.claim(("a", "image")).payload is a  # a is now the most recent
    cache.release(a)
    d = _insert(cache, "d", 100)  # evicts b (least recent), though c and d are still leased
    snap = cache.snapshot()
    assert snap["retained_bytes"] == 300 and snap["evictions"] == 1
    assert cache.claim(("b", "image")).build is not None  # b is gone: a miss that builds
    # c is leased: evicting it keeps it live until its lease ends
    cache.release(d)
    e = _insert(cache, "e", 250)  # forces c and a out of the LRU
    assert cache.snapshot()["retained_bytes"] <= 300
    assert cache.live_bytes <= 1000
    assert cache.live_bytes > cache.retained_bytes  # c still live through its lease
    cache.release(e)


def test_live_budget_evicts_unleased_then_refuses() -> None:
    cache = MediaCache(cache_bytes=1000, live_bytes=300)
    a = _insert(cache, "a", 200)
    claim = cache.claim(("b", "image"))
    cache.finish(claim, _payload("b", 200), None)  # a is leased: nothing can make room
    with pytest.raises(MediaError) as err:
        claim.build.result()
    assert err.value.code == "media_budget_exceeded"
    assert cache.snapshot()["rejected"] == 1 and cache.live_bytes == 200
    cache.release(a)  # a stays retained but unleased: the next build may evict it
    b = _insert(cache, "b", 200)
    assert cache.live_bytes == 200 and cache.claim(("a", "image")).build is not None
    cache.release(b)


def test_cache_zero_retains_nothing_and_returns_live_bytes() -> None:
    cache = MediaCache(cache_bytes=0, live_bytes=1000)
    a = _insert(cache, "a", 100)
    assert cache.live_bytes == 100 and cache.retained_bytes == 0
    cache.release(a)
    cache.release(a)  # a second release of the same payload is a no-op
    assert cache.snapshot()["live_bytes"] == 0 and cache.snapshot()["entries"] == 0


def _dropped_build(cache: MediaCache) -> tuple[Claim, PreparedMedia]:
    """A build of key a with a waiter that has not woken yet, released by its builder: with
    cache_bytes 0 the entry is gone. Returns (the waiter's claim, the built payload)."""
    first = cache.claim(("a", "image"))
    waiter = cache.claim(("a", "image"))
    assert first.build is not None and waiter.wait is first.build
    built = _payload("a", 100)
    cache.finish(first, built, None)
    cache.release(built)
    assert cache.live_bytes == 0
    return waiter, built


def test_a_late_waiter_leases_the_rebuilt_entry_and_leaks_nothing() -> None:
    """The interleaving the soak once hit: a waiter wakes after its build was dropped and a second
    build of the same key took its place. Overwriting that entry left its bytes live forever."""
    cache = MediaCache(cache_bytes=0, live_bytes=1000)  # nothing retained: a release drops
    waiter, _ = _dropped_build(cache)
    second = cache.claim(("a", "image"))
    assert second.build is not None
    rebuilt = _payload("a", 100)
    cache.finish(second, rebuilt, None)
    held = cache.join(waiter, waiter.wait.result())
    assert held is rebuilt and cache.live_bytes == 100
    cache.release(held)
    cache.release(rebuilt)
    assert cache.snapshot()["live_bytes"] == 0 and cache.snapshot()["entries"] == 0


def test_a_waiter_whose_build_was_dropped_accounts_it_again() -> None:
    cache = MediaCache(cache_bytes=0, live_bytes=1000)
    waiter, built = _dropped_build(cache)
    held = cache.join(waiter, waiter.wait.result())
    assert held is built and cache.live_bytes == 100
    cache.release(held)
    assert cache.snapshot()["live_bytes"] == 0


def test_a_build_that_lands_after_a_late_waiter_readmitted_its_key_leases_that_entry() -> None:
    cache = MediaCache(cache_bytes=0, live_bytes=1000)
    waiter, built = _dropped_build(cache)
    second = cache.claim(("a", "image"))  # a second build starts
    held = cache.join(waiter, waiter.wait.result())  # the late waiter re-admits the first bytes
    assert held is built and cache.live_bytes == 100
    cache.finish(second, _payload("a", 100), None)
    assert second.build.result() is built and cache.live_bytes == 100
    cache.release(held)
    cache.release(second.build.result())
    assert cache.snapshot()["live_bytes"] == 0 and cache.snapshot()["entries"] == 0


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_concurrent_identical_misses_build_once(monkeypatch: pytest.MonkeyPatch) -> None:
    prep = MediaPreparer(SETTINGS, dtype=torch.float32, limits=MediaLimits(threads=4))
    gate = threading.Event()
    real_build = prep._build
    calls = []

    def slow_build(src, data, digest):  # noqa: ANN001, ANN202
        calls.append(digest)
        gate.wait(10)
        return real_build(src, data, digest)

    monkeypatch.setattr(prep, "_build", slow_build)
    src = MediaSource("image", _uri(encode_image(noise_image(40, 40)), "image/png"), "p")
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(prep.prepare, [src]) for _ in range(6)]
        while prep.cache.snapshot()["misses"] < 6:  # every caller has claimed the key
            threading.Event().wait(0.01)
        gate.set()
        leases = [f.result() for f in futures]
    snap = prep.cache.snapshot()
    assert len(calls) == 1 and snap["builds"] == 1 and snap["single_flight_waits"] == 5
    assert all(lease.items[0] is leases[0].items[0] for lease in leases)
    for lease in leases:
        lease.release()
    assert prep.cache.live_bytes == prep.cache.retained_bytes
    prep.close()


def test_a_failed_item_releases_the_others() -> None:
    prep = MediaPreparer(SETTINGS, dtype=torch.float32, limits=MediaLimits(cache_mib=0))
    good = MediaSource("image", _uri(encode_image(noise_image(30, 30)), "image/png"), "m[0]")
    bad = MediaSource("image", _uri(b"garbage", "image/png"), "m[1]")
    with pytest.raises(MediaError) as err:
        prep.prepare([good, bad])
    assert err.value.param == "m[1]"
    prep.close()
    assert prep.cache.snapshot()["live_bytes"] == 0


def test_request_token_envelope() -> None:
    limits = MediaLimits(max_request_tokens=100)
    prep = MediaPreparer(SETTINGS, dtype=torch.float32, limits=limits)
    big = MediaSource("image", _uri(encode_image(noise_image(256, 256)), "image/png"), "p")
    prep.prepare([big]).release()  # 256 x 256 -> 64 merged tokens
    with pytest.raises(MediaError) as err:
        prep.prepare([big, big])  # 128 > 100
    assert err.value.code == "media_budget_exceeded"
    snap = prep.cache.snapshot()
    assert snap["entries"] == snap["retained"] and snap["live_bytes"] == snap["retained_bytes"]
    prep.close()


@pytest.mark.slow
def test_soak_mixed_requests_hold_budgets_and_leak_nothing() -> None:
    images = [encode_image(noise_image(40 + 13 * i, 50 + 7 * i, seed=i)) for i in range(10)]
    sources = [MediaSource("image", _uri(b, "image/png"), f"img{i}") for i, b in enumerate(images)]
    sources.append(MediaSource("video", _uri(make_video(12, 6, 64, 48), "video/mp4"), "vid"))
    sources.append(MediaSource("image", _uri(b"\x00bad", "image/png"), "bad"))
    # budgets far below the working set, so eviction and refusals happen throughout
    sizes = []
    probe = MediaPreparer(SETTINGS, dtype=torch.float32)
    for s in sources[:-1]:
        lease = probe.prepare([s])
        sizes.append(lease.items[0].nbytes)
        lease.release()
    probe.close()
    cache_bytes, live_bytes = 3 * max(sizes), 6 * max(sizes)
    prep = MediaPreparer(SETTINGS, dtype=torch.float32, limits=MediaLimits(threads=3))
    prep.cache = MediaCache(cache_bytes, live_bytes)
    violations: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.002):
            snap = prep.cache.snapshot()
            if snap["live_bytes"] > live_bytes or snap["retained_bytes"] > cache_bytes:
                violations.append(str(snap))

    outcomes = {"ok": 0, "budget": 0, "invalid": 0}
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            pick = rng.sample(sources, rng.randint(1, 3))
            try:
                lease = prep.prepare(pick)
            except MediaError as e:
                with lock:
                    outcomes["budget" if e.code == "media_budget_exceeded" else "invalid"] += 1
                continue
            assert [m.modality for m in lease.items] == [s.kind for s in pick]
            lease.release()
            with lock:
                outcomes["ok"] += 1

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    stop.set()
    watcher.join()
    prep.close()
    snap = prep.cache.snapshot()
    assert not violations, violations[:3]
    assert outcomes["ok"] > 50 and outcomes["invalid"] > 0
    assert snap["hits"] > 0 and snap["evictions"] > 0
    # nothing leaks: once every lease is released only LRU-retained payloads stay live
    assert snap["inflight"] == 0
    assert snap["live_bytes"] == snap["retained_bytes"] <= cache_bytes
    assert snap["entries"] == snap["retained"]
