"""Settings helpers: bad values fail loudly with the variable's name."""

import pytest

from efficiency.env import (
    EnvError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    env_url,
    parse_database_url,
)


def test_bool_accepts_common_spellings_and_rejects_typos():
    assert env_bool("DEBUG", False, env={"DEBUG": "Yes"}) is True
    assert env_bool("DEBUG", True, env={"DEBUG": "off"}) is False
    assert env_bool("DEBUG", True, env={}) is True
    with pytest.raises(EnvError, match=r"DEBUG='ture' is not a boolean"):
        env_bool("DEBUG", False, env={"DEBUG": "ture"})


def test_int_and_float_reject_garbage_and_out_of_range_values():
    assert env_int("N", 3, env={"N": " 7 "}) == 7
    with pytest.raises(EnvError, match="EMAIL_PORT='smtp' is not an integer"):
        env_int("EMAIL_PORT", 25, env={"EMAIL_PORT": "smtp"})
    with pytest.raises(EnvError, match="above the maximum"):
        env_float("TARGET_MFU", 0.45, max_value=1.0, env={"TARGET_MFU": "45"})
    with pytest.raises(EnvError, match="finite"):
        env_float("TARGET_MFU", 0.45, env={"TARGET_MFU": "nan"})


def test_required_string_without_default_names_the_variable():
    with pytest.raises(EnvError, match="SECRET_KEY is required"):
        env_str("SECRET_KEY", None, env={})
    assert env_str("X", "d", env={"X": ""}) == "d"


def test_choice_and_list_and_url():
    assert env_choice("TIER", "on_demand", ("on_demand", "spot"), env={"TIER": "spot"}) == "spot"
    with pytest.raises(EnvError, match="must be one of: on_demand, spot"):
        env_choice("TIER", "on_demand", ("on_demand", "spot"), env={"TIER": "cheap"})
    assert env_list("HOSTS", [], env={"HOSTS": "a.example, b.example,,"}) == ["a.example", "b.example"]
    assert env_url("P", "http://x", schemes=("http",), env={"P": "http://prom:9090/"}) == "http://prom:9090"
    with pytest.raises(EnvError, match="PROMETHEUS_URL='prom:9090' must be a URL"):
        env_url("PROMETHEUS_URL", "http://x", schemes=("http", "https"), env={"PROMETHEUS_URL": "prom:9090"})


def test_database_url_parses_credentials_port_and_options():
    cfg = parse_database_url("postgres://u%40x:p%2Fw@db.example:6432/eff?sslmode=require")
    assert (cfg.user, cfg.password, cfg.host, cfg.port, cfg.name) == ("u@x", "p/w", "db.example", 6432, "eff")
    assert cfg.as_django()["OPTIONS"] == {"sslmode": "require"}
    assert cfg.as_django()["ENGINE"] == "django.db.backends.postgresql"


def test_database_url_rejects_other_databases_and_missing_name():
    with pytest.raises(EnvError, match="only PostgreSQL"):
        parse_database_url("mysql://u:p@h/db")
    with pytest.raises(EnvError, match="no database name"):
        parse_database_url("postgres://u:p@h:5432/")
    with pytest.raises(EnvError, match="invalid port"):
        parse_database_url("postgres://u:p@h:99999/db")
