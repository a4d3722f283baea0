"""Where a cache directory really is: the facts the server uses to tell a shared cache from two local
directories that only share a path."""

from __future__ import annotations

import os

import torch

from agents import environment
from agents.crash import describe


def test_locations_resolve_links_and_name_the_filesystem(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    found = environment.cache_locations({"inductor": str(tmp_path / "link"), "triton": str(real / "not-yet")})
    assert found["inductor"]["path"] == str(real)
    assert found["triton"]["path"] == str(real / "not-yet")  # created by the first compile; its fs is the parent's
    assert found["inductor"]["fs"] and found["inductor"]["shared"] is False
    assert "fsid" not in found["inductor"]  # a local disk's id: the host names it already


def test_a_network_filesystem_counts_as_shared_and_names_its_id(monkeypatch, tmp_path):
    monkeypatch.setattr(environment, "_mounts", lambda: [(str(tmp_path), "nfs4"), ("/", "ext4")])
    found = environment.cache_locations({"inductor": str(tmp_path)})["inductor"]
    assert found["shared"] is True and found["fsid"] == format(os.statvfs(tmp_path).f_fsid, "x")


def _inner():
    raise RuntimeError("bad shape")


def test_a_crash_names_type_message_and_innermost_frame():
    try:
        _inner()
    except RuntimeError as exc:
        crash = describe(exc)
    assert (crash.exc_type, crash.reason) == ("RuntimeError", "RuntimeError: bad shape")
    assert crash.where.startswith("agents/test_environment.py:") and crash.where.endswith(" _inner")


def test_settings_name_compiler_values_that_differ_from_torchs_defaults():
    import torch

    before = environment.settings()
    assert "inductor.fallback_random" not in before
    with torch._inductor.config.patch(fallback_random=True), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        after = environment.settings()
    assert after["inductor.fallback_random"] == "True" and after["dynamo.automatic_dynamic_shapes"] == "False"
    assert set(after) - set(before) == {"inductor.fallback_random", "dynamo.automatic_dynamic_shapes"}
    assert environment.settings() == before


def test_the_device_is_where_the_rank_computes_never_its_local_rank():
    """Ranks sharing one GPU all compute on cuda:0, whatever their local rank; the parameters say where
    (the grad tracker keeps the first optimizer's first parameter's device for rank_start)."""
    from agents.grads import GradTracker

    assert environment.device(torch.device("cuda", 0)) == "cuda:0"
    tracker = GradTracker(lambda e: None, 1, 0)
    tracker.install()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    finally:
        tracker.uninstall()
    assert tracker.device == torch.device("cpu") and environment.device(tracker.device) == "cpu"
