"""Store URLs and local paths."""

from __future__ import annotations

import os

import pytest

from runtime.params import ParamStoreError
from runtime.params.location import parse_location


@pytest.mark.parametrize(
    ("url", "driver", "path"),
    [
        ("file:///runs/a/params", "file", "/runs/a/params/"),
        ("file:///runs/a/params/", "file", "/runs/a/params/"),
        ("file://localhost/runs/a", "file", "/runs/a/"),
        ("file:///runs/with%20space", "file", "/runs/with space/"),
        ("FILE:///runs/x/../y", "file", "/runs/y/"),
        ("/runs/b", "file", "/runs/b/"),
        ("memory://", "memory", ""),
        ("memory://run-1", "memory", "run-1/"),
        ("memory://run-1/params/", "memory", "run-1/params/"),
    ],
)
def test_parse(url, driver, path):
    location = parse_location(url)
    assert (location.driver, location.path, location.url) == (driver, path, url)
    assert location.kvstore("manifests/") == {"driver": driver, "path": path + "manifests/"}


def test_relative_path_is_made_absolute():
    assert parse_location("runs/p").path == os.path.join(os.getcwd(), "runs", "p") + "/"
    assert parse_location("runs/p").directory == os.path.join(os.getcwd(), "runs", "p")
    assert parse_location("memory://x").directory is None


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("gs://bucket/params", "scheme 'gs' in 'gs://bucket/params' is not supported; use file://"),
        ("http://host/p", "scheme 'http'"),
        ("file://runs/p", "does not hold an absolute path; use file:///absolute/path"),
        ("", "URL '' is not accepted; use file:///absolute/path, memory://name"),
    ],
)
def test_rejected(url, message):
    with pytest.raises(ParamStoreError, match=message):
        parse_location(url)
