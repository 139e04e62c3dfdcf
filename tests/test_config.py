"""Elector settings: validated up front, with messages that name the rule."""

from __future__ import annotations

import dataclasses
import math
import re
import socket
from datetime import timedelta
from typing import Any

import pytest
import redis

import redlease


def elector(client: redis.Redis, **kwargs: Any) -> redlease.Elector:
    kwargs.setdefault("engine", "python")
    return redlease.Elector(client, kwargs.pop("name", "svc"), **kwargs)


def config_error(client: redis.Redis, **kwargs: Any) -> str:
    with pytest.raises(redlease.ConfigError) as info:
        elector(client, **kwargs)
    return str(info.value)


def test_config_error_is_a_value_error_and_a_redlease_error() -> None:
    assert issubclass(redlease.ConfigError, ValueError)
    assert issubclass(redlease.ConfigError, redlease.RedleaseError)


def test_default_ttl_is_five_seconds() -> None:
    assert redlease.DEFAULT_TTL == redlease.ELECTOR_DEFAULT_TTL == 5.0


def test_client_none_is_rejected() -> None:
    with pytest.raises(redlease.ConfigError, match="client"):
        redlease.Elector(None, "svc", engine="python")


def test_empty_name_is_rejected(client: redis.Redis) -> None:
    message = config_error(client, name="")
    assert "name" in message
    assert "empty" in message


@pytest.mark.parametrize("setting", ["ttl", "renew_interval", "acquire_interval"])
@pytest.mark.parametrize("value", [-1, -0.5, 0, 0.0, timedelta(seconds=-1), timedelta(0)])
def test_non_positive_duration_is_rejected(client: redis.Redis, setting: str, value: Any) -> None:
    message = config_error(client, **{"ttl": 10, setting: value})
    assert setting in message
    assert re.search(r"positive|> ?0|greater than (0|zero)", message), message


@pytest.mark.parametrize("setting", ["ttl", "renew_interval", "acquire_interval"])
def test_nan_duration_is_rejected(client: redis.Redis, setting: str) -> None:
    message = config_error(client, **{"ttl": 10, setting: math.nan})
    assert setting in message
    assert "NaN" in message or "nan" in message


@pytest.mark.parametrize("setting", ["ttl", "renew_interval", "acquire_interval"])
@pytest.mark.parametrize("value", [True, False])
def test_bool_duration_is_rejected(client: redis.Redis, setting: str, value: bool) -> None:
    message = config_error(client, **{"ttl": 10, setting: value})
    assert setting in message
    assert "bool" in message


@pytest.mark.parametrize("ttl", [0.0999, 0.05, 0.1 - 1e-7])
def test_ttl_below_a_tenth_of_a_second_after_truncation_is_rejected(
    client: redis.Redis, ttl: float
) -> None:
    message = config_error(client, ttl=ttl)
    assert "ttl" in message
    assert "0.1" in message


def test_ttl_of_exactly_a_tenth_of_a_second_is_accepted(client: redis.Redis) -> None:
    assert elector(client, ttl=0.1).config.ttl == 0.1


def test_ttl_is_truncated_to_whole_milliseconds(client: redis.Redis) -> None:
    assert elector(client, ttl=0.2505).config.ttl == 0.25
    assert elector(client, ttl=1.9999).config.ttl == 1.999


def test_ttl_accepts_timedelta(client: redis.Redis) -> None:
    assert elector(client, ttl=timedelta(milliseconds=2500)).config.ttl == 2.5


def test_durations_are_float_seconds(client: redis.Redis) -> None:
    cfg = elector(client, ttl=3, renew_interval=1, acquire_interval=timedelta(seconds=2)).config
    assert (cfg.ttl, cfg.renew_interval, cfg.acquire_interval) == (3.0, 1.0, 2.0)
    assert all(type(v) is float for v in (cfg.ttl, cfg.renew_interval, cfg.acquire_interval))


def test_defaults_are_five_second_ttl_renew_a_third_and_acquire_a_half(client: redis.Redis) -> None:
    cfg = elector(client).config
    assert cfg.ttl == 5.0
    assert cfg.renew_interval == pytest.approx(5.0 / 3)
    assert cfg.acquire_interval == pytest.approx(2.5)


def test_interval_defaults_derive_from_the_truncated_ttl(client: redis.Redis) -> None:
    cfg = elector(client, ttl=0.2505).config
    assert cfg.renew_interval == pytest.approx(0.25 / 3)
    assert cfg.acquire_interval == pytest.approx(0.125)


def test_renew_interval_above_half_the_ttl_is_rejected(client: redis.Redis) -> None:
    message = config_error(client, ttl=1.0, renew_interval=0.501)
    assert "renew_interval" in message
    assert "ttl/2" in message or "half" in message


def test_renew_interval_of_exactly_half_the_ttl_is_accepted(client: redis.Redis) -> None:
    assert elector(client, ttl=1.0, renew_interval=0.5).config.renew_interval == 0.5


@pytest.mark.parametrize("acquire", [1.0, 1.5])
def test_acquire_interval_not_below_the_ttl_is_rejected(
    client: redis.Redis, acquire: float
) -> None:
    message = config_error(client, ttl=1.0, acquire_interval=acquire)
    assert "acquire_interval" in message
    assert "ttl" in message


def test_acquire_interval_just_below_the_ttl_is_accepted(client: redis.Redis) -> None:
    assert elector(client, ttl=1.0, acquire_interval=0.999).config.acquire_interval == 0.999


@pytest.mark.parametrize("setting", ["renew_interval", "acquire_interval"])
def test_interval_below_one_millisecond_is_rejected(client: redis.Redis, setting: str) -> None:
    message = config_error(client, ttl=1.0, **{setting: 0.0009})
    assert setting in message
    assert "1 ms" in message or "0.001" in message


@pytest.mark.parametrize("setting", ["renew_interval", "acquire_interval"])
def test_interval_of_one_millisecond_is_accepted(client: redis.Redis, setting: str) -> None:
    cfg = elector(client, ttl=1.0, **{setting: 0.001}).config
    assert getattr(cfg, setting) == 0.001


def test_config_is_a_frozen_dataclass(client: redis.Redis) -> None:
    cfg = elector(client, name="jobs", instance_id="a-1").config
    assert isinstance(cfg, redlease.Config)
    assert (cfg.name, cfg.instance_id) == ("jobs", "a-1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ttl = 1.0  # type: ignore[misc]


def test_default_instance_id_is_hostname_and_sixteen_hex_digits(client: redis.Redis) -> None:
    e = elector(client)
    assert re.fullmatch(re.escape(socket.gethostname()) + r"-[0-9a-f]{16}", e.instance_id)
    assert e.config.instance_id == e.instance_id
    assert elector(client).instance_id != e.instance_id


def test_explicit_instance_id_is_kept(client: redis.Redis) -> None:
    assert elector(client, instance_id="replica-7").instance_id == "replica-7"


def test_engine_property_names_the_engine_in_use(client: redis.Redis, engine: str) -> None:
    assert elector(client, engine=engine).engine == engine
